// Array conversions between fp32 and bf16 (uint16_t storage), bit-identical to core/dtype.h's
// scalar f32_to_bf16 / bf16_to_f32: round to nearest even, NaN stays a (quiet) NaN, denormals
// are rounded like any other value rather than flushed. AVX512 when the CPU has it, else a
// portable loop; the portable versions are exposed so tests can compare both on this machine.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::cpu {

void f32_to_bf16_array(const float* src, uint16_t* dst, size_t n);
void bf16_to_f32_array(const uint16_t* src, float* dst, size_t n);
// x[i] = round_bf16(x[i]) in place and, when dst is given, dst[i] = the bf16 bits: rounding to
// the bf16 policy and storing in bf16 in one pass.
void round_bf16_array(float* x, uint16_t* dst, size_t n);

// The same on one thread, without SIMD intrinsics (the reference and the non-x86 path).
void f32_to_bf16_array_portable(const float* src, uint16_t* dst, size_t n);
void bf16_to_f32_array_portable(const uint16_t* src, float* dst, size_t n);
void round_bf16_array_portable(float* x, uint16_t* dst, size_t n);

// Whether the AVX512 conversion loops run on this CPU (AVX512F + AVX512BW).
bool bf16_convert_uses_avx512();

}  // namespace loom::cpu
