// Gemma's CPU kernels against float64 references written here: GeGLU, soft-capping, and causal
// attention with a sliding window and soft-capped scores (forward, and backward against central
// differences of the float64 forward); with neither option the variant equals the tiled kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "grad_check.h"
#include "kernels/cpu/cpu_ops.h"

namespace loom {
namespace {

using test::all_close;
using test::numeric_gradient;
using test::random_floats;
using test::to_f64;
using test::Vec;

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(GemmaOps, GegluForwardAndBackward) {
  const int N = 3, F = 5;
  const auto x = random_floats(size_t(N) * 2 * F, 1, -2.f, 2.f);
  const auto w = random_floats(size_t(N) * F, 2);
  auto ref = [&](const Vec& in) {
    Vec out(size_t(N) * F);
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < F; ++j)
        out[size_t(i) * F + j] =
            gelu_tanh(in[size_t(i) * 2 * F + j]) * in[size_t(i) * 2 * F + F + j];
    return out;
  };
  std::vector<float> out(size_t(N) * F), dx(x.size());
  cpu::geglu_forward(out.data(), x.data(), N, F);
  EXPECT_TRUE(all_close(out, ref(to_f64(x)), 1e-5, 1e-5));
  cpu::geglu_backward(dx.data(), x.data(), w.data(), N, F);
  const Vec g =
      numeric_gradient([&](const Vec& in) { return test::dot(ref(in), to_f64(w)); }, to_f64(x));
  EXPECT_TRUE(all_close(dx, g, 1e-4, 1e-4));
}

TEST(GemmaOps, SoftcapForwardAndBackward) {
  const float cap = 1.5f;
  auto x = random_floats(64, 3, -6.f, 6.f);
  const auto d0 = random_floats(64, 4);
  Vec want(x.size()), grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    want[i] = cap * std::tanh(double(x[i]) / cap);
    const double t = std::tanh(double(x[i]) / cap);
    grad[i] = d0[i] * (1 - t * t);
  }
  cpu::softcap_forward(x.data(), int64_t(x.size()), cap);
  EXPECT_TRUE(all_close(x, want, 1e-6, 1e-6));
  std::vector<float> d = d0;
  cpu::softcap_backward(d.data(), x.data(), int64_t(d.size()), cap);
  EXPECT_TRUE(all_close(d, grad, 1e-5, 1e-5));
}

// Two packed sequences (7 and 5 tokens), grouped-query heads 4 over 2, D = 6, fused rows.
struct Case {
  int Hq = 4, Hkv = 2, D = 6;
  std::vector<int32_t> cu = {0, 7, 12};
  int N() const { return cu.back(); }
  int ld() const { return (Hq + 2 * Hkv) * D; }
};

// The float64 forward: out [N, Hq * D] of qkv [N, ld].
Vec reference(const Case& c, const Vec& qkv, float scale, int window, float softcap) {
  const int ld = c.ld(), D = c.D, g = c.Hq / c.Hkv;
  Vec out(size_t(c.N()) * c.Hq * D, 0.0);
  for (size_t s = 0; s + 1 < c.cu.size(); ++s)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = c.cu[s]; i < c.cu[s + 1]; ++i) {
        std::vector<double> z;
        std::vector<int> keys;
        for (int j = c.cu[s]; j <= i; ++j) {
          if (window > 0 && i - j >= window) continue;
          double sc = 0;
          for (int d = 0; d < D; ++d)
            sc += qkv[size_t(i) * ld + h * D + d] * qkv[size_t(j) * ld + (c.Hq + h / g) * D + d];
          sc *= scale;
          if (softcap > 0) sc = softcap * std::tanh(sc / softcap);
          z.push_back(sc);
          keys.push_back(j);
        }
        double m = -1e300, l = 0;
        for (double v : z) m = std::max(m, v);
        for (double& v : z) l += (v = std::exp(v - m));
        for (size_t k = 0; k < keys.size(); ++k)
          for (int d = 0; d < D; ++d)
            out[size_t(i) * c.Hq * D + h * D + d] +=
                z[k] / l * qkv[size_t(keys[k]) * ld + (c.Hq + c.Hkv + h / g) * D + d];
      }
  return out;
}

TEST(GemmaOps, AttentionVariantMatchesTheFloat64Reference) {
  const Case c;
  const auto qkv = random_floats(size_t(c.N()) * c.ld(), 5, -1.5f, 1.5f);
  const float* q = qkv.data();
  const float* k = q + c.Hq * c.D;
  const float* v = k + c.Hkv * c.D;
  for (int window : {0, 3}) {
    for (float softcap : {0.f, 0.8f}) {
      std::vector<float> out(size_t(c.N()) * c.Hq * c.D), lse(size_t(c.N()) * c.Hq);
      cpu::attention_variant_forward(out.data(), lse.data(), q, k, v, c.ld(), c.cu.data(), 2, c.Hq,
                                     c.Hkv, c.D, 0.5f, window, softcap);
      EXPECT_TRUE(all_close(out, reference(c, to_f64(qkv), 0.5f, window, softcap), 1e-5, 1e-5))
          << "window " << window << " softcap " << softcap;
      // The gradient of sum(w * out) against central differences of the float64 forward.
      const auto w = random_floats(out.size(), 6);
      std::vector<float> dqkv(qkv.size(), 7.f);  // overwritten, not accumulated
      cpu::attention_variant_backward(dqkv.data(), dqkv.data() + c.Hq * c.D,
                                      dqkv.data() + (c.Hq + c.Hkv) * c.D, w.data(), q, k, v,
                                      out.data(), lse.data(), c.ld(), c.cu.data(), 2, c.Hq, c.Hkv,
                                      c.D, 0.5f, window, softcap);
      const Vec g = numeric_gradient(
          [&](const Vec& x) {
            return test::dot(reference(c, x, 0.5f, window, softcap), to_f64(w));
          },
          to_f64(qkv));
      EXPECT_TRUE(all_close(dqkv, g, 2e-4, 2e-4)) << "window " << window << " softcap " << softcap;
      if (window != 0 || softcap != 0) continue;
      // Neither option: the tiled kernel's results.
      std::vector<float> out2(out.size()), lse2(lse.size());
      cpu::attention_forward(out2.data(), lse2.data(), q, k, v, c.ld(), c.cu.data(), 2, c.Hq, c.Hkv,
                             c.D, 0.5f);
      EXPECT_TRUE(all_close(out2, to_f64(out), 1e-5, 1e-5));
      EXPECT_TRUE(all_close(lse2, to_f64(lse), 1e-5, 1e-5));
    }
  }
}

}  // namespace
}  // namespace loom
