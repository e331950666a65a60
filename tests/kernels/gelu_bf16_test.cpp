// The fused GeLU passes over bf16-stored inputs (kernels/cpu/gelu_bf16.cpp) against the separate
// passes they replace (widen, GeLU, narrow; round dout, GeLU's gradient, round with bits), bit
// for bit, at lengths below and above the fork/join threshold and around the 16K-element block.
#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/cpu_ops.h"

using namespace loom;

namespace {

std::vector<float> values(size_t n, uint64_t salt, bool bf16) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = 8.f * (uniform_at(salt, 1, i) - 0.5f);
    if (bf16) v[i] = round_bf16(v[i]);
  }
  return v;
}

std::vector<uint16_t> bits_of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

}  // namespace

TEST(GeluBf16, FusedPassesEqualTheSeparatePasses) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (size_t n :
         {size_t{1000}, size_t{16384}, size_t{16385}, size_t{3} * 16384 + 17, size_t{21} * 3072}) {
      const std::vector<float> fc = values(n, 3, true);  // fc as stored: bf16 values
      const std::vector<uint16_t> fc16 = bits_of(fc);
      // Forward, from fp32 and from the bf16 storage.
      std::vector<float> act(n);
      cpu::gelu_forward(act.data(), fc.data(), int64_t(n));
      const std::vector<uint16_t> want = bits_of(act);
      for (bool from16 : {false, true}) {
        std::vector<uint16_t> got(n + 1, 0xabcd);
        cpu::gelu_forward_bf16(got.data(), from16 ? nullptr : fc.data(),
                               from16 ? fc16.data() : nullptr, int64_t(n));
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(got[i], want[i]) << threads << " threads, n " << n << ", at " << i;
        EXPECT_EQ(got[n], 0xabcd);
      }
      // Backward: dout not yet rounded (rounded in place when asked), dinp rounded with bits.
      const std::vector<float> dout0 = values(n, 5, false);
      std::vector<float> dout = dout0, dinp(n);
      cpu::round_bf16_array(dout.data(), nullptr, n);
      cpu::gelu_backward(dinp.data(), fc.data(), dout.data(), int64_t(n));
      std::vector<uint16_t> dbits(n);
      cpu::round_bf16_array(dinp.data(), dbits.data(), n);
      for (bool with_bits : {false, true}) {
        std::vector<float> d = dout0, got(n + 1, -7.f);
        std::vector<uint16_t> gbits(n + 1, 0xabcd);
        cpu::gelu_backward_bf16(got.data(), with_bits ? gbits.data() : nullptr, fc16.data(),
                                d.data(), true, int64_t(n));
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(f32_bits(got[i]), f32_bits(dinp[i])) << threads << " threads, " << i;
          ASSERT_EQ(f32_bits(d[i]), f32_bits(dout[i])) << "dout rounded in place, at " << i;
          if (with_bits) {
            ASSERT_EQ(gbits[i], dbits[i]) << i;
          }
        }
        EXPECT_EQ(got[n], -7.f);
        EXPECT_EQ(gbits[n], 0xabcd);
      }
      // Without rounding dout: dout stays as given and is used as given.
      std::vector<float> d = dout0, got(n), ref(n);
      cpu::gelu_backward_bf16(got.data(), nullptr, fc16.data(), d.data(), false, int64_t(n));
      cpu::gelu_backward(ref.data(), fc.data(), dout0.data(), int64_t(n));
      cpu::round_bf16_array(ref.data(), nullptr, n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(f32_bits(d[i]), f32_bits(dout0[i]));
        ASSERT_EQ(f32_bits(got[i]), f32_bits(ref[i])) << i;
      }
    }
  }
  omp_set_num_threads(saved);
}
