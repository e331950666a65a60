#include "core/dtype.h"

#include "core/error.h"

namespace loom {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::F8E4M3:
      return 1;
    case DType::F8E5M2:
      return 1;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
    case DType::U16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
    case DType::F8E4M3:
      return "fp8_e4m3";
    case DType::F8E5M2:
      return "fp8_e5m2";
    case DType::I32:
      return "int32";
    case DType::I64:
      return "int64";
    case DType::U8:
      return "uint8";
    case DType::U16:
      return "uint16";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2, DType::I32,
                  DType::I64, DType::U8, DType::U16})
    if (n == dtype_name(t)) return t;
  fail("unknown dtype '", n, "' (expected fp32, bf16, fp16, fp8_e4m3, fp8_e5m2, int32, ...)");
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Add 0.5 (as a float) so the hardware rounds the mantissa to nearest even at 2^-24 steps.
    float v = bits_f32(a) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_bits(v) - 0x3f000000u));
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (a >> 13));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return bits_f32(f32_bits(v) | sign);
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

namespace {
// Generic small-float encoder: `mbits` mantissa bits, exponent bias `bias`, largest finite
// value `maxv`. Values are rounded to nearest even, saturated to +-maxv (the recipes' choice).
uint8_t encode_small(float f, int mbits, int bias, float maxv, uint8_t nan_code) {
  if (std::isnan(f)) return nan_code;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= maxv) a = maxv;
  if (a == 0.f) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;    // a = 1.xxx * 2^exp
  int min_exp = 1 - bias;
  if (exp < min_exp) exp = min_exp;  // subnormal range: fixed quantum
  float quantum = std::ldexp(1.f, exp - mbits);
  float q = std::nearbyint(a / quantum);  // default rounding mode: nearest even
  float v = q * quantum;
  if (v == 0.f) return sign;  // rounded to zero (below half the smallest subnormal)
  if (v > maxv) v = maxv;
  // Re-encode v exactly.
  std::frexp(v, &e);
  exp = e - 1;
  uint32_t code;
  if (exp < min_exp) {
    code = static_cast<uint32_t>(v / std::ldexp(1.f, min_exp - mbits));
  } else {
    uint32_t mant = static_cast<uint32_t>(std::ldexp(v, -exp) * (1 << mbits)) - (1u << mbits);
    code = (static_cast<uint32_t>(exp + bias) << mbits) | mant;
  }
  return static_cast<uint8_t>(sign | code);
}

float decode_small(uint8_t b, int mbits, int bias) {
  float sign = (b & 0x80) ? -1.f : 1.f;
  int exp = (b & 0x7f) >> mbits;
  int mant = b & ((1 << mbits) - 1);
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), 1 - bias - mbits);
  return sign * std::ldexp(1.f + static_cast<float>(mant) / (1 << mbits), exp - bias);
}
}  // namespace

uint8_t f32_to_e4m3(float f) {
  return encode_small(f, 3, 7, 448.f, 0x7f);
}
float e4m3_to_f32(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return NAN;
  return decode_small(b, 3, 7);
}
uint8_t f32_to_e5m2(float f) {
  if (std::isinf(f)) return f > 0 ? 0x7c : 0xfc;
  return encode_small(f, 2, 15, 57344.f, 0x7f);
}
float e5m2_to_f32(uint8_t b) {
  int exp = (b & 0x7f) >> 2;
  if (exp == 31) return (b & 3) ? NAN : ((b & 0x80) ? -INFINITY : INFINITY);
  return decode_small(b, 2, 15);
}

void round_to(DType t, float* x, size_t n) {
  switch (t) {
    case DType::F32:
      return;
    case DType::BF16:
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
      return;
    case DType::F16:
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; ++i) x[i] = round_f16(x[i]);
      return;
    case DType::F8E4M3:
      for (size_t i = 0; i < n; ++i) x[i] = e4m3_to_f32(f32_to_e4m3(x[i]));
      return;
    case DType::F8E5M2:
      for (size_t i = 0; i < n; ++i) x[i] = e5m2_to_f32(f32_to_e5m2(x[i]));
      return;
    default:
      fail("round_to: ", dtype_name(t), " is not a floating type");
  }
}

}  // namespace loom
