// FP8 formats for the FP8 / MXFP8 GEMM recipes (precision/fp8_recipes.h), as the OCP 8-bit
// floating point spec (OFP8) and the OCP Microscaling spec v1.0 define them:
//   E4M3 ("FN"): bias 7, max normal 448 (S.1111.110), no infinities, NaN = S.1111.111;
//                min normal 2^-6, subnormals k * 2^-9.
//   E5M2:        bias 15, max normal 57344 (S.11110.11), inf = S.11111.00, NaN =
//   S.11111.{01,10,11};
//                min normal 2^-14, subnormals k * 2^-16.
//   E8M0 (MX block scale): unsigned, bias 127, X = 2^(e - 127) for e in 0..254, 0xFF = NaN.
// fp32 -> fp8 rounds to nearest even and saturates: every finite value beyond the max normal and
// +-inf become +-max normal (CUDA's __NV_SATFINITE cast, the one Transformer Engine uses); NaN
// becomes NaN (E4M3: S.1111.111; E5M2: S.11111.10, the quiet NaN CUDA gives for a default NaN).
// fp8 -> fp32 is exact. Note that this differs from core/dtype.h's f32_to_e5m2 (inf stays inf).
//
// Array functions use AVX512 when the CPU has it; the portable loop gives identical bits (the
// same integer rounding and the same fp32 additions, so MXCSR's rounding and DAZ apply equally).
#pragma once

#include <cstdint>

namespace loom::cpu {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

constexpr float fp8_max(Fp8Format f) {
  return f == Fp8Format::E4M3 ? 448.f : 57344.f;
}
// emax_elem of the MX spec: the exponent of the largest normal (448 = 1.75 * 2^8).
constexpr int fp8_emax(Fp8Format f) {
  return f == Fp8Format::E4M3 ? 8 : 15;
}
const char* fp8_format_name(Fp8Format f);  // "e4m3" / "e5m2"

// Scalar conversions (the reference the array versions are tested against).
uint8_t fp8_encode(Fp8Format f, float x);
float fp8_decode(Fp8Format f, uint8_t code);
// fp8_decode(fp8_encode(x)) without the code.
float fp8_round(Fp8Format f, float x);

// The MX block scale for a block whose largest magnitude is `amax` (OCP MX v1.0 section 6.3):
// X = 2^(floor(log2(amax)) - emax_elem), the exponent clamped to [-127, 127]; amax == 0 gives
// the smallest scale 2^-127 (code 0x00); a NaN or infinite amax gives NaN (0xFF), and every
// element of that block decodes to NaN.
uint8_t e8m0_block_scale(float amax, Fp8Format elem);
float e8m0_to_f32(uint8_t code);  // 2^(code - 127); NaN for 0xFF

// max |x[i]| over the array (NaN when any element is NaN; +inf when any is infinite).
float fp8_amax(const float* x, int64_t n);
// The same over bf16 bits (their widened values): half the bytes of the fp32 array.
float fp8_amax(const uint16_t* x_bf16, int64_t n);

// Delayed scaling's history step on host memory: Backend::fp8_roll_history's CPU op (its
// contract is there).
void fp8_roll_history(Fp8Format f, float* history, int len, int32_t* pos_count, float* pending,
                      const float* amax, float* scale, int margin, bool most_recent);

// q[i] = fp8 code of x[i] * scale; y[i] = decode(q[i]) * scale_inv.
void fp8_quantize(Fp8Format f, const float* x, float scale, uint8_t* q, int64_t n);
void fp8_dequantize(Fp8Format f, const uint8_t* q, float scale_inv, float* y, int64_t n);

// out[i] = the bf16 bits of fp8_round(x[i] * scale): the fp8 value itself, which bf16 holds
// exactly (at most 4 significant bits, exponents 2^-16 .. 2^15). A bf16 GEMM of these values
// with fp32 accumulation, times 1/(scale_a * scale_b), is the per-tensor fp8 GEMM.
void fp8_scaled_to_bf16(Fp8Format f, const float* x, float scale, uint16_t* out, int64_t n);
// x as bf16 bits: the same bits as widening x to fp32 first (bf16 -> fp32 is exact).
void fp8_scaled_to_bf16(Fp8Format f, const uint16_t* x_bf16, float scale, uint16_t* out, int64_t n);
// fp8_scaled_to_bf16 and fp8_amax(x) in one pass (delayed scaling: the scale is known before
// the amax): returns the amax.
float fp8_scaled_to_bf16_amax(Fp8Format f, const float* x, float scale, uint16_t* out, int64_t n);
float fp8_scaled_to_bf16_amax(Fp8Format f, const uint16_t* x_bf16, float scale, uint16_t* out,
                              int64_t n);

// MXFP8 of a row-major [rows, cols] matrix x (leading dimension ld), 32-element blocks along
//   - the columns (along_rows = false): block b of row r is x[r, 32b .. 32b+31], scales
//     [rows, ceil(cols/32)];
//   - the rows (along_rows = true): block b of column c is x[32b .. 32b+31, c], scales
//     [ceil(rows/32), cols].
// A last block shorter than 32 is the zero-padded block of the spec (padding zeros change no
// amax and are not stored). Outputs (each nullable): scales (E8M0 codes), codes (fp8 codes,
// [rows, cols] dense) and deq, the bf16 bits of decode(code) * X, dense [rows, cols]. X is a
// power of two, so deq is exact in bf16, except that values below 2^-126 (blocks with amax
// under ~2^-118) are flushed to zero, as the bf16 GEMM's VDPBF16PS does with denormals anyway.
void mx_quantize(Fp8Format f, const float* x, int rows, int cols, int ld, bool along_rows,
                 uint8_t* scales, uint8_t* codes, uint16_t* deq);
// x as bf16 bits: the same results as widening x to fp32 first.
void mx_quantize(Fp8Format f, const uint16_t* x_bf16, int rows, int cols, int ld, bool along_rows,
                 uint8_t* scales, uint8_t* codes, uint16_t* deq);
// Both blockings of a dense [rows, cols] x at once (a weight's forward and dgrad copies): deq_cols
// = mx_quantize's deq with along_rows = false, deq_rows with along_rows = true; one read of x
// from memory (32 rows at a time, the second blocking from cache).
void mx_quantize_both(Fp8Format f, const float* x, int rows, int cols, uint16_t* deq_cols,
                      uint16_t* deq_rows);
void mx_quantize_both(Fp8Format f, const uint16_t* x_bf16, int rows, int cols, uint16_t* deq_cols,
                      uint16_t* deq_rows);

// Tests: run the portable loops even on an AVX512 CPU (true), or choose automatically (false).
void force_fp8_portable(bool force);
bool fp8_uses_avx512();

}  // namespace loom::cpu
