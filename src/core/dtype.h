// Element types and their conversions. Rounding is round-to-nearest-even everywhere, so the CPU
// reproduces what GPU conversions (__float2bfloat16_rn, __float2half_rn) produce.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace loom {

enum class DType : uint8_t { F32, BF16, F16, F8E4M3, F8E5M2, I32, I64, U8, U16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // throws on unknown names

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16: upper 16 bits of fp32, rounded to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

// IEEE fp16 (1-5-10); overflow goes to inf as on the GPU, which is what loss scaling detects.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
inline float round_f16(float f) {
  return f16_to_f32(f32_to_f16(f));
}

// OCP fp8: e4m3 (no inf, max 448, saturating) and e5m2 (IEEE-like, max 57344).
uint8_t f32_to_e4m3(float f);
float e4m3_to_f32(uint8_t b);
uint8_t f32_to_e5m2(float f);
float e5m2_to_f32(uint8_t b);

// Rounds every value of x to the precision of `t` in place (storage stays fp32). Used where the
// CPU computes in fp32 on values that a GPU would have stored in a narrower type.
void round_to(DType t, float* x, size_t n);

}  // namespace loom
