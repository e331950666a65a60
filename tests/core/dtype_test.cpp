#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

using namespace loom;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.f, -8))), 1.015625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

TEST(DType, Fp16ExactValuesAndOverflow) {
  for (float v : {0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f /*min normal*/,
                  5.960464477539063e-08f /*min subnormal*/, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(65520.f))));  // rounds past max: inf
  EXPECT_EQ(f16_to_f32(f32_to_f16(65519.f)), 65504.f);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + std::ldexp(1.f, -11))), 1.0f);  // tie to even
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(DType, Fp16MatchesExhaustiveDecodeRoundTrip) {
  // Every finite half decodes and re-encodes to itself.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    EXPECT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h);
  }
}

TEST(DType, Fp8RoundTripsAndSaturates) {
  for (uint32_t b = 0; b < 256; ++b) {
    float v = e4m3_to_f32(static_cast<uint8_t>(b));
    if (std::isnan(v)) continue;
    if (v == 0.f) continue;  // +0 / -0 both fine
    EXPECT_EQ(f32_to_e4m3(v), b) << b;
  }
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1000.f)), 448.f);
  EXPECT_EQ(e5m2_to_f32(f32_to_e5m2(1e6f)), 57344.f);
  for (uint32_t b = 0; b < 256; ++b) {
    float v = e5m2_to_f32(static_cast<uint8_t>(b));
    if (std::isnan(v) || std::isinf(v) || v == 0.f) continue;
    EXPECT_EQ(f32_to_e5m2(v), b) << b;
  }
}

TEST(DType, RoundToChangesOnlyLowBits) {
  float x[3] = {1.f / 3.f, 100.001f, -7.f};
  round_to(DType::BF16, x, 3);
  EXPECT_EQ(x[0], round_bf16(1.f / 3.f));
  EXPECT_EQ(x[2], -7.f);
  EXPECT_NE(x[0], 1.f / 3.f);
}
