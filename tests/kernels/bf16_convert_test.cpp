// fp32 <-> bf16 array conversions against core/dtype.h's scalar functions, bit for bit.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/bf16_convert.h"

using namespace loom;

namespace {

// Rounding edge cases as fp32 bit patterns, each also negated.
std::vector<uint32_t> edge_bits() {
  const std::vector<uint32_t> positive = {
      0x00000000u,  // zero
      0x00000001u,  // smallest denormal: rounds to zero
      0x00008000u,  // denormal exactly halfway, even lsb: stays 0
      0x00018000u,  // denormal halfway, odd lsb: rounds up
      0x00008001u,  // denormal just above halfway
      0x007fffffu,  // largest denormal: rounds up to the smallest normal
      0x00800000u,  // smallest normal
      0x3f800000u,  // 1
      0x3f808000u,  // tie, even lsb: down
      0x3f818000u,  // tie, odd lsb: up
      0x3f807fffu,  // just below a tie
      0x3f808001u,  // just above a tie
      0x3fffffffu,  // rounds up across the exponent
      0x7f7f7fffu,  // largest value that stays finite
      0x7f7f8000u,  // tie at the top: rounds to inf
      0x7f7fffffu,  // largest finite fp32: rounds to inf
      0x7f800000u,  // inf
      0x7f800001u,  // signalling NaN with only a low payload bit: must stay NaN
      0x7fa00000u,  // signalling NaN
      0x7fc00000u,  // quiet NaN
      0x7fffffffu,  // NaN, all payload bits (the rounding add would carry into the sign)
  };
  std::vector<uint32_t> all = positive;
  for (uint32_t b : positive) all.push_back(b | 0x80000000u);
  return all;
}

std::vector<float> floats_of(const std::vector<uint32_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = bits_f32(bits[i]);
  return f;
}

// Checks every conversion of `src` against the scalar function, bit for bit.
void expect_matches_scalar(const std::vector<float>& src) {
  std::vector<uint16_t> fast(src.size()), portable(src.size());
  cpu::f32_to_bf16_array(src.data(), fast.data(), src.size());
  cpu::f32_to_bf16_array_portable(src.data(), portable.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    const uint16_t want = f32_to_bf16(src[i]);
    ASSERT_EQ(fast[i], want) << "fp32 bits 0x" << std::hex << f32_bits(src[i]) << " at " << i;
    ASSERT_EQ(portable[i], want) << "fp32 bits 0x" << std::hex << f32_bits(src[i]);
  }
  // Rounding in place (with and without storing the bits) gives round_bf16 and those bits.
  for (bool store : {false, true}) {
    std::vector<float> x = src, xp = src;
    std::vector<uint16_t> bits(src.size(), 0xabcd), bits_p(src.size(), 0xabcd);
    cpu::round_bf16_array(x.data(), store ? bits.data() : nullptr, x.size());
    cpu::round_bf16_array_portable(xp.data(), store ? bits_p.data() : nullptr, xp.size());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint32_t want = f32_bits(round_bf16(src[i]));
      ASSERT_EQ(f32_bits(x[i]), want) << "fp32 bits 0x" << std::hex << f32_bits(src[i]);
      ASSERT_EQ(f32_bits(xp[i]), want) << "fp32 bits 0x" << std::hex << f32_bits(src[i]);
      ASSERT_EQ(bits[i], store ? f32_to_bf16(src[i]) : 0xabcd);
      ASSERT_EQ(bits_p[i], store ? f32_to_bf16(src[i]) : 0xabcd);
    }
  }
}

}  // namespace

TEST(Bf16Convert, EdgeValuesMatchScalarAtEveryTailLength) {
  const std::vector<float> edges = floats_of(edge_bits());
  // Every length up to two vectors plus one and every start offset within a vector, so the
  // masked tail and unaligned loads are exercised for each edge value.
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t len = 0; len <= 33; ++len) {
      std::vector<float> src(len);
      for (size_t i = 0; i < len; ++i) src[i] = edges[(i + offset * 3) % edges.size()];
      std::vector<float> buf(offset + len);
      std::copy(src.begin(), src.end(), buf.begin() + offset);
      std::vector<uint16_t> out(offset + len + 1, 0xabcd);
      cpu::f32_to_bf16_array(buf.data() + offset, out.data() + offset, len);
      for (size_t i = 0; i < len; ++i)
        ASSERT_EQ(out[offset + i], f32_to_bf16(src[i])) << "offset " << offset << " len " << len;
      // Nothing written past the end.
      ASSERT_EQ(out[offset + len], 0xabcd) << "offset " << offset << " len " << len;
      for (size_t i = 0; i < offset; ++i) ASSERT_EQ(out[i], 0xabcd);
      // The same for rounding in place with the bits stored.
      std::vector<float> x(offset + len + 1, 7.f);
      std::copy(src.begin(), src.end(), x.begin() + offset);
      std::vector<uint16_t> bits(offset + len + 1, 0xabcd);
      cpu::round_bf16_array(x.data() + offset, bits.data() + offset, len);
      for (size_t i = 0; i < len; ++i) {
        ASSERT_EQ(f32_bits(x[offset + i]), f32_bits(round_bf16(src[i])));
        ASSERT_EQ(bits[offset + i], f32_to_bf16(src[i]));
      }
      ASSERT_EQ(x[offset + len], 7.f);
      ASSERT_EQ(bits[offset + len], 0xabcd);
    }
  }
  expect_matches_scalar(edges);
}

TEST(Bf16Convert, NaNStaysNaN) {
  const std::vector<float> nans = floats_of({0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu});
  std::vector<uint16_t> out(nans.size());
  cpu::f32_to_bf16_array(nans.data(), out.data(), nans.size());
  for (uint16_t h : out) EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << std::hex << h;
}

TEST(Bf16Convert, RandomBitPatternsMatchScalar) {
  // Every kind of value, over several parallel parts.
  std::vector<float> src(300007);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (auto& f : src) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    uint32_t bits = static_cast<uint32_t>(s >> 16);
    // A quarter of the values are exact ties, which uniform bits almost never hit.
    if ((s & 3) == 0) bits = (bits & 0xffff0000u) | 0x8000u;
    f = bits_f32(bits);
  }
  expect_matches_scalar(src);
}

// The arrays are split into one part per thread (multiples of 16 elements, the last part takes
// the rest): every element converted once, nothing past the end written, at any team size and
// at lengths around the split's threshold (32K elements) and the Decoder's 64K-float blocks.
TEST(Bf16Convert, SplitOverThreadsCoversEveryElement) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 5, 64}) {
    omp_set_num_threads(threads);
    for (size_t n :
         {size_t{32767}, size_t{32768}, size_t{32769}, size_t{65536} + 15, size_t{3} * 65536 + 3}) {
      std::vector<float> src(n);
      for (size_t i = 0; i < n; ++i)  // distinct per element, with bits below bf16's to round
        src[i] = bits_f32(0x3f800000u + static_cast<uint32_t>(i) * 0x1235u);
      std::vector<uint16_t> out(n + 1, 0xabcd);
      cpu::f32_to_bf16_array(src.data(), out.data(), n);
      std::vector<float> wide(n + 1, -7.f), x = src;
      x.push_back(-7.f);
      std::vector<uint16_t> bits(n + 1, 0xabcd);
      cpu::bf16_to_f32_array(out.data(), wide.data(), n);
      cpu::round_bf16_array(x.data(), bits.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = f32_to_bf16(src[i]);
        ASSERT_EQ(out[i], want) << threads << " threads, n " << n << ", at " << i;
        ASSERT_EQ(f32_bits(wide[i]), f32_bits(bf16_to_f32(want))) << threads << " threads, " << i;
        ASSERT_EQ(f32_bits(x[i]), f32_bits(round_bf16(src[i]))) << threads << " threads, " << i;
        ASSERT_EQ(bits[i], want) << threads << " threads, n " << n << ", at " << i;
      }
      EXPECT_EQ(out[n], 0xabcd);
      EXPECT_EQ(wide[n], -7.f);
      EXPECT_EQ(x[n], -7.f);
      EXPECT_EQ(bits[n], 0xabcd);
    }
  }
  omp_set_num_threads(saved);
}

TEST(Bf16Convert, EveryBf16WidensExactly) {
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> fast(all.size()), portable(all.size());
  cpu::bf16_to_f32_array(all.data(), fast.data(), all.size());
  cpu::bf16_to_f32_array_portable(all.data(), portable.data(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(f32_bits(fast[i]), f32_bits(bf16_to_f32(all[i]))) << i;
    ASSERT_EQ(f32_bits(portable[i]), f32_bits(bf16_to_f32(all[i]))) << i;
  }
  // Tails: lengths 0..17 leave the element after the end alone.
  for (size_t len = 0; len <= 17; ++len) {
    std::vector<float> out(len + 1, -7.0f);
    cpu::bf16_to_f32_array(all.data() + 3, out.data(), len);
    for (size_t i = 0; i < len; ++i) ASSERT_EQ(f32_bits(out[i]), f32_bits(bf16_to_f32(all[3 + i])));
    ASSERT_EQ(out[len], -7.0f);
  }
}

TEST(Bf16Convert, ReportsItsPath) {
  // On x86 with AVX512BW the vector path must be the one in use (else it would go untested).
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512bw")) {
    EXPECT_TRUE(cpu::bf16_convert_uses_avx512());
  }
#else
  EXPECT_FALSE(cpu::bf16_convert_uses_avx512());
#endif
}
