// FP8 / E8M0 formats: test vectors from the OCP OFP8 and MX v1.0 specs, bit-exact; the
// vectorised loops against the portable ones; MX block scales of hand-made blocks.
#include "kernels/cpu/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace loom::cpu {
namespace {

constexpr auto E4 = Fp8Format::E4M3;
constexpr auto E5 = Fp8Format::E5M2;

float p2(int e) {
  return std::ldexp(1.f, e);
}

TEST(Fp8Format, E4M3SpecVectors) {
  struct V {
    float x;
    uint8_t code;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const V vs[] = {
      {0.f, 0x00},           {-0.f, 0x80},        {1.f, 0x38},
      {-2.f, 0xC0},          {448.f, 0x7E},       {-448.f, 0xFE},
      {240.f, 0x77},         {p2(-6), 0x08},                              // min normal
      {7 * p2(-9), 0x07},    {p2(-9), 0x01},      {-p2(-9), 0x81},        // max / min subnormal
      {p2(-10), 0x00},       {3 * p2(-11), 0x01}, {1.5f * p2(-9), 0x02},  // ties to even
      {2.5f * p2(-9), 0x02}, {1.0625f, 0x38},     {1.1875f, 0x3A},
      {-1.1875f, 0xBA},      {464.f, 0x7E},       {479.f, 0x7E},
      {1e6f, 0x7E},          {inf, 0x7E},                                 // saturate
      {-inf, 0xFE},          {p2(-149), 0x00},    {7.5f * p2(-9), 0x08},  // rounds up to normal
  };
  for (const V& v : vs) {
    EXPECT_EQ(fp8_encode(E4, v.x), v.code) << v.x;
    if ((v.code & 0x7f) != 0x7f) {
      EXPECT_EQ(fp8_round(E4, v.x), fp8_decode(E4, v.code));
    }
  }
  EXPECT_EQ(fp8_encode(E4, std::nanf("")), 0x7F);
  EXPECT_EQ(fp8_encode(E4, -std::nanf("")), 0xFF);
  EXPECT_TRUE(std::isnan(fp8_decode(E4, 0x7F)));
  EXPECT_TRUE(std::isnan(fp8_decode(E4, 0xFF)));
  EXPECT_EQ(fp8_decode(E4, 0x7E), 448.f);
  EXPECT_EQ(fp8_decode(E4, 0x01), p2(-9));
  EXPECT_EQ(fp8_decode(E4, 0x77), 240.f);
  EXPECT_TRUE(std::signbit(fp8_decode(E4, 0x80)));
}

TEST(Fp8Format, E5M2SpecVectors) {
  struct V {
    float x;
    uint8_t code;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const V vs[] = {
      {1.f, 0x3C},     {57344.f, 0x7B},     {-57344.f, 0xFB}, {61440.f, 0x7B},  // tie: saturated
      {1e9f, 0x7B},    {inf, 0x7B},         {-inf, 0xFB},     {p2(-14), 0x04},  // min normal
      {p2(-16), 0x01}, {3 * p2(-16), 0x03}, {p2(-17), 0x00},  {3 * p2(-17), 0x02},
      {1.125f, 0x3C},  {1.375f, 0x3E},      {-1.375f, 0xBE},  {0.f, 0x00},
  };
  for (const V& v : vs) EXPECT_EQ(fp8_encode(E5, v.x), v.code) << v.x;
  EXPECT_EQ(fp8_encode(E5, std::nanf("")), 0x7E);
  EXPECT_EQ(fp8_decode(E5, 0x7C), inf);
  EXPECT_EQ(fp8_decode(E5, 0xFC), -inf);
  for (uint8_t c : {0x7D, 0x7E, 0x7F, 0xFD}) EXPECT_TRUE(std::isnan(fp8_decode(E5, c)));
  EXPECT_EQ(fp8_decode(E5, 0x7B), 57344.f);
  EXPECT_EQ(fp8_decode(E5, 0x01), p2(-16));
}

// Every finite code decodes to a value that encodes back to the same code (both signs).
TEST(Fp8Format, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v4 = fp8_decode(E4, uint8_t(c));
    if (!std::isnan(v4)) {
      EXPECT_EQ(fp8_encode(E4, v4), c);
    }
    const float v5 = fp8_decode(E5, uint8_t(c));
    if (std::isfinite(v5)) {
      EXPECT_EQ(fp8_encode(E5, v5), c);
    }
  }
}

// Against core/dtype.h's independent frexp/nearbyint encoder over a sweep of fp32 bit patterns
// (both saturate finite values; NaN's sign and E5M2's infinities are where they differ).
TEST(Fp8Format, AgreesWithCoreEncoderOnAFloatSweep) {
  for (uint64_t u = 0; u <= 0xffffffffu; u += 1021) {
    const float x = bits_f32(uint32_t(u));
    if (std::isnan(x)) continue;
    ASSERT_EQ(fp8_encode(E4, x), f32_to_e4m3(x)) << std::hexfloat << x;
    if (!std::isinf(x)) {
      ASSERT_EQ(fp8_encode(E5, x), f32_to_e5m2(x)) << std::hexfloat << x;
    }
  }
}

TEST(Fp8Format, E8M0Scales) {
  EXPECT_EQ(e8m0_to_f32(127), 1.f);
  EXPECT_EQ(e8m0_to_f32(0), p2(-127));
  EXPECT_EQ(e8m0_to_f32(254), p2(127));
  EXPECT_EQ(e8m0_to_f32(130), 8.f);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  // X = 2^(floor(log2(amax)) - emax_elem), emax = 8 (E4M3) / 15 (E5M2).
  EXPECT_EQ(e8m0_block_scale(448.f, E4), 127);
  EXPECT_EQ(e8m0_block_scale(511.f, E4), 127);
  EXPECT_EQ(e8m0_block_scale(512.f, E4), 128);
  EXPECT_EQ(e8m0_block_scale(1.f, E4), 119);
  EXPECT_EQ(e8m0_block_scale(3.f, E4), 120);
  EXPECT_EQ(e8m0_block_scale(1.f, E5), 112);
  EXPECT_EQ(e8m0_block_scale(std::numeric_limits<float>::max(), E4), 246);
  EXPECT_EQ(e8m0_block_scale(0.f, E4), 0);       // clamps to 2^-127
  EXPECT_EQ(e8m0_block_scale(p2(-130), E4), 0);  // denormal amax: clamps too
  EXPECT_EQ(e8m0_block_scale(p2(-110), E4), 9);  // -118 + 127
  EXPECT_EQ(e8m0_block_scale(INFINITY, E4), 0xFF);
  EXPECT_EQ(e8m0_block_scale(std::nanf(""), E4), 0xFF);
}

// A hand-made block: amax 3.9 -> floor(log2) = 1 -> X = 2^-7 (code 120). Elements are V/X,
// rounded to E4M3 and clamped: 3.9*128 = 499.2 -> 448 (0x7E); -128 (0xF0); 0.01*128 = 1.28 ->
// 1.25 (0x3A); 2^-13 -> 0. The second, short block (8 columns, zero padded) has amax 1e-3 ->
// floor(log2) = -10 -> X = 2^-18 (code 109); 1e-3 * 2^18 = 262.144 -> 256 (0x78).
TEST(Fp8Mx, HandMadeBlocks) {
  std::vector<float> x(40, 0.f);
  x[0] = 3.9f;
  x[1] = -1.f;
  x[2] = 0.01f;
  x[3] = p2(-20);
  x[33] = 1e-3f;
  x[34] = -5e-4f;  // 131.072 -> 128 (0xF0 negative)
  for (bool portable : {true, false}) {
    force_fp8_portable(portable);
    std::vector<uint8_t> s(2), c(40);
    std::vector<uint16_t> d(40);
    mx_quantize(E4, x.data(), 1, 40, 40, false, s.data(), c.data(), d.data());
    EXPECT_EQ(s[0], 120);
    EXPECT_EQ(s[1], 109);
    EXPECT_EQ(c[0], 0x7E);
    EXPECT_EQ(c[1], 0xF0);
    EXPECT_EQ(c[2], 0x3A);
    EXPECT_EQ(c[3], 0x00);
    EXPECT_EQ(c[33], 0x78);
    EXPECT_EQ(c[34], 0xF0);
    EXPECT_EQ(bf16_to_f32(d[0]), 3.5f);  // 448 * 2^-7
    EXPECT_EQ(bf16_to_f32(d[2]), 1.25f * p2(-7));
    EXPECT_EQ(bf16_to_f32(d[33]), 256.f * p2(-18));
  }
  force_fp8_portable(false);
}

TEST(Fp8Mx, NonFiniteBlockIsNanOthersUntouched) {
  std::vector<float> x(64, 0.5f);
  x[5] = std::nanf("");
  std::vector<uint8_t> s(2), c(64);
  std::vector<uint16_t> d(64);
  mx_quantize(E4, x.data(), 1, 64, 64, false, s.data(), c.data(), d.data());
  EXPECT_EQ(s[0], 0xFF);
  EXPECT_EQ(s[1], e8m0_block_scale(0.5f, E4));
  EXPECT_EQ(c[0] & 0x7f, 0x7F);
  EXPECT_TRUE(std::isnan(bf16_to_f32(d[0])));
  EXPECT_EQ(bf16_to_f32(d[40]), 0.5f);
}

// Blocks along the rows of x are blocks along the columns of x^T.
TEST(Fp8Mx, RowBlocksAreColumnBlocksOfTheTranspose) {
  const int R = 70, C = 45;  // neither a multiple of 32
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(R) * C), xt(size_t(R) * C);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) xt[size_t(c) * R + r] = x[size_t(r) * C + c] = nd(g) * p2(r % 9);
  std::vector<uint8_t> s1(3 * C), s2(C * 3), c1(x.size()), c2(x.size());
  std::vector<uint16_t> d1(x.size()), d2(x.size());
  mx_quantize(E4, x.data(), R, C, C, true, s1.data(), c1.data(), d1.data());
  mx_quantize(E4, xt.data(), C, R, R, false, s2.data(), c2.data(), d2.data());
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      ASSERT_EQ(c1[size_t(r) * C + c], c2[size_t(c) * R + r]);
      ASSERT_EQ(d1[size_t(r) * C + c], d2[size_t(c) * R + r]);
    }
  for (int b = 0; b < 3; ++b)
    for (int c = 0; c < C; ++c) ASSERT_EQ(s1[size_t(b) * C + c], s2[size_t(c) * 3 + b]);
}

// Inputs mixing every range: normals, subnormals of both formats, fp32 denormals, values past
// the max normal, infinities, NaN, exact ties.
std::vector<float> mixed_inputs(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> e(-30, 20), kind(0, 19);
  std::uniform_real_distribution<float> m(-2.f, 2.f);
  std::vector<float> x(n);
  for (float& v : x) {
    const int k = kind(g);
    v = k == 0   ? std::numeric_limits<float>::infinity() * (m(g) < 0 ? -1 : 1)
        : k == 1 ? std::nanf("")
        : k == 2 ? bits_f32(g() & 0x807fffffu)                                    // fp32 denormal
        : k == 3 ? std::ldexp(std::round(m(g) * 64.f) / 64.f + 0.0078125f, e(g))  // ties
                 : std::ldexp(m(g), e(g));
  }
  return x;
}

TEST(Fp8Simd, VectorLoopsMatchPortableBits) {
  if (!fp8_uses_avx512()) GTEST_SKIP() << "no AVX512 on this CPU: only the portable loop runs";
  for (int n : {1, 15, 16, 17, 100, 1000, 40000}) {
    const std::vector<float> x = mixed_inputs(size_t(n), uint32_t(n));
    for (Fp8Format f : {E4, E5})
      for (float scale : {1.f, 0.37f, 1024.f}) {
        std::vector<uint8_t> qa(n), qb(n);
        std::vector<uint16_t> ba(n), bb(n);
        force_fp8_portable(true);
        fp8_quantize(f, x.data(), scale, qa.data(), n);
        fp8_scaled_to_bf16(f, x.data(), scale, ba.data(), n);
        const float amax_a = fp8_amax(x.data(), n);
        force_fp8_portable(false);
        fp8_quantize(f, x.data(), scale, qb.data(), n);
        fp8_scaled_to_bf16(f, x.data(), scale, bb.data(), n);
        ASSERT_EQ(qa, qb) << "n=" << n;
        ASSERT_EQ(ba, bb) << "n=" << n;
        ASSERT_EQ(f32_bits(amax_a), f32_bits(fp8_amax(x.data(), n)));
        for (int i = 0; i < n; ++i) {  // and each against the scalar encoder
          ASSERT_EQ(qa[size_t(i)], fp8_encode(f, x[size_t(i)] * scale));
          const float v = fp8_round(f, x[size_t(i)] * scale);
          if (!std::isnan(v)) {
            ASSERT_EQ(bf16_to_f32(ba[size_t(i)]), v);
          }
        }
      }
  }
  const std::vector<float> x = mixed_inputs(50 * 77, 9);
  for (bool along_rows : {false, true}) {
    std::vector<uint8_t> sa(2 * 77 * 3), sb(sa.size()), ca(x.size()), cb(x.size());
    std::vector<uint16_t> da(x.size()), db(x.size());
    force_fp8_portable(true);
    mx_quantize(E4, x.data(), 50, 77, 77, along_rows, sa.data(), ca.data(), da.data());
    force_fp8_portable(false);
    mx_quantize(E4, x.data(), 50, 77, 77, along_rows, sb.data(), cb.data(), db.data());
    EXPECT_EQ(sa, sb);
    EXPECT_EQ(ca, cb);
    EXPECT_EQ(da, db);
  }
}

// The passes the recipes run on bf16 storage (activations, the 2-byte weights, dy's bits) give
// the bits of the fp32 passes on the widened values; the fused cast + amax (delayed scaling) the
// bits of the two passes; mx_quantize_both those of both blockings. Each on the AVX512 and the
// portable loops, with and without non-finite inputs, with short blocks in both directions.
TEST(Fp8Simd, Bf16InputsAndFusedPassesMatchTheSeparateFp32Passes) {
  for (bool portable : {true, false}) {
    if (!portable && !fp8_uses_avx512()) continue;
    force_fp8_portable(portable);
    for (bool finite : {true, false})
      for (int n : {1, 17, 1000, 50 * 77, 70000}) {
        SCOPED_TRACE(testing::Message()
                     << "portable " << portable << " finite " << finite << " n " << n);
        std::vector<float> x = mixed_inputs(size_t(n), uint32_t(n) + 5);
        std::vector<uint16_t> bits(static_cast<size_t>(n));
        for (size_t i = 0; i < x.size(); ++i) {
          if (finite && !std::isfinite(x[i])) x[i] = -0.5f * float(i % 7);
          bits[i] = f32_to_bf16(x[i]);
          x[i] = bf16_to_f32(bits[i]);  // the widened values
        }
        ASSERT_EQ(f32_bits(fp8_amax(bits.data(), n)), f32_bits(fp8_amax(x.data(), n)));
        if (finite || n >= 1000) {  // NaN wins
          ASSERT_EQ(std::isnan(fp8_amax(x.data(), n)), !finite);
        }
        for (Fp8Format f : {E4, E5})
          for (float scale : {1.f, 0.37f, 1024.f}) {
            const size_t sz = static_cast<size_t>(n);
            std::vector<uint16_t> ref(sz), a(sz), b(sz), c(sz);
            fp8_scaled_to_bf16(f, x.data(), scale, ref.data(), n);
            fp8_scaled_to_bf16(f, bits.data(), scale, a.data(), n);
            const float amax_f = fp8_scaled_to_bf16_amax(f, x.data(), scale, b.data(), n);
            const float amax_b = fp8_scaled_to_bf16_amax(f, bits.data(), scale, c.data(), n);
            ASSERT_EQ(a, ref);
            ASSERT_EQ(b, ref);
            ASSERT_EQ(c, ref);
            ASSERT_EQ(f32_bits(amax_f), f32_bits(fp8_amax(x.data(), n)));
            ASSERT_EQ(f32_bits(amax_b), f32_bits(fp8_amax(x.data(), n)));
          }
      }
    for (auto [rows, cols] : {std::pair{50, 77}, std::pair{64, 96}, std::pair{33, 31}}) {
      SCOPED_TRACE(testing::Message() << "portable " << portable << " " << rows << "x" << cols);
      const int64_t n = int64_t(rows) * cols;
      std::vector<float> x = mixed_inputs(size_t(n), uint32_t(rows));
      std::vector<uint16_t> bits(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        bits[size_t(i)] = f32_to_bf16(x[size_t(i)]);
        x[size_t(i)] = bf16_to_f32(bits[size_t(i)]);
      }
      std::vector<uint16_t> by_cols(static_cast<size_t>(n)), by_rows(static_cast<size_t>(n)),
          d(static_cast<size_t>(n)), e(static_cast<size_t>(n));
      for (bool along_rows : {false, true}) {
        std::vector<uint8_t> sa(static_cast<size_t>(n)), sb(static_cast<size_t>(n)),
            ca(static_cast<size_t>(n)), cb(static_cast<size_t>(n));
        mx_quantize(E4, x.data(), rows, cols, cols, along_rows, sa.data(), ca.data(),
                    (along_rows ? by_rows : by_cols).data());
        mx_quantize(E4, bits.data(), rows, cols, cols, along_rows, sb.data(), cb.data(), d.data());
        EXPECT_EQ(sa, sb);
        EXPECT_EQ(ca, cb);
        EXPECT_EQ(d, along_rows ? by_rows : by_cols);
      }
      mx_quantize_both(E4, x.data(), rows, cols, d.data(), e.data());
      EXPECT_EQ(d, by_cols);
      EXPECT_EQ(e, by_rows);
      mx_quantize_both(E4, bits.data(), rows, cols, d.data(), e.data());
      EXPECT_EQ(d, by_cols);
      EXPECT_EQ(e, by_rows);
    }
  }
  force_fp8_portable(false);
}

// A [rows, cols] matrix whose line i (row i when by_row, else column i) holds values from
// 2^(e_i - 24) to 2^(e_i + 1), e_i sweeping -152 .. 128 over the lines: its blocks along the
// lines sweep every MX block scale (zero, denormal and non-finite amaxes, the AVX512 fast path's
// bound k = -100, the largest), with zeros, ties, fp32 denormals and a NaN here and there.
std::vector<float> scale_sweep(int rows, int cols, bool by_row, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> m(-2.f, 2.f);
  std::uniform_int_distribution<int> kind(0, 15), drop(0, 24);
  const int lines = by_row ? rows : cols;
  std::vector<float> x(size_t(rows) * size_t(cols));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const int i = by_row ? r : c, e = -152 + i * 280 / (lines - 1);
      const int k = kind(g);
      float& v = x[size_t(r) * size_t(cols) + size_t(c)];
      v = k == 0   ? (m(g) < 0 ? -0.f : 0.f)
          : k == 1 ? std::ldexp(std::round(m(g) * 64.f) / 64.f + 0.0078125f, e)  // ties
          : k == 2 ? bits_f32(g() & 0x807fffffu)                                 // fp32 denormal
                   : std::ldexp(m(g), e - drop(g));
      if (g() % 2000 == 0) v = std::nanf("");
    }
  return x;
}

// The first index where a and b differ (-1: none), for a message naming the element.
int64_t first_difference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

// The MX loops asked for the dequantised values only (as the recipes ask: the AVX512 loops'
// fast path for ordinary block scales) give the portable loop's bits, on blocks of every scale,
// both formats, fp32 and bf16 inputs, both blockings and mx_quantize_both, short last blocks.
TEST(Fp8Simd, MxDequantisedValuesMatchPortableOverEveryBlockScale) {
  if (!fp8_uses_avx512()) GTEST_SKIP() << "no AVX512 on this CPU: only the portable loop runs";
  for (bool by_row : {true, false})
    for (Fp8Format f : {E4, E5}) {
      const int rows = by_row ? 300 : 77, cols = by_row ? 77 : 300;
      SCOPED_TRACE(testing::Message() << fp8_format_name(f) << " " << rows << "x" << cols);
      std::vector<float> x = scale_sweep(rows, cols, by_row, by_row ? 1u : 2u);
      const size_t n = x.size();
      std::vector<uint16_t> bits(n);
      std::vector<float> widened(n);
      for (size_t i = 0; i < n; ++i) widened[i] = bf16_to_f32(bits[i] = f32_to_bf16(x[i]));
      for (bool bf16_in : {false, true}) {
        const float* xf = bf16_in ? widened.data() : x.data();
        std::vector<uint16_t> ref_cols(n), ref_rows(n), got(n), got2(n);
        force_fp8_portable(true);
        mx_quantize(f, xf, rows, cols, cols, false, nullptr, nullptr, ref_cols.data());
        mx_quantize(f, xf, rows, cols, cols, true, nullptr, nullptr, ref_rows.data());
        force_fp8_portable(false);
        for (bool along_rows : {false, true}) {
          if (bf16_in)
            mx_quantize(f, bits.data(), rows, cols, cols, along_rows, nullptr, nullptr, got.data());
          else
            mx_quantize(f, x.data(), rows, cols, cols, along_rows, nullptr, nullptr, got.data());
          const int64_t i = first_difference(got, along_rows ? ref_rows : ref_cols);
          ASSERT_EQ(i, -1) << "along_rows " << along_rows << ": x " << xf[i] << " gives "
                           << got[size_t(i)] << ", portable "
                           << (along_rows ? ref_rows : ref_cols)[size_t(i)];
        }
        if (bf16_in)
          mx_quantize_both(f, bits.data(), rows, cols, got.data(), got2.data());
        else
          mx_quantize_both(f, x.data(), rows, cols, got.data(), got2.data());
        ASSERT_EQ(first_difference(got, ref_cols), -1);
        ASSERT_EQ(first_difference(got2, ref_rows), -1);
      }
    }
}

TEST(Fp8Simd, AmaxPropagatesNanAndInf) {
  std::vector<float> x(100, -3.f);
  EXPECT_EQ(fp8_amax(x.data(), 100), 3.f);
  x[77] = -INFINITY;
  EXPECT_EQ(fp8_amax(x.data(), 100), INFINITY);
  x[3] = std::nanf("");
  EXPECT_TRUE(std::isnan(fp8_amax(x.data(), 100)));
}

}  // namespace
}  // namespace loom::cpu
