// Weight-only bf16 / int8 linear layers (serving): against a double-precision reference on the
// same (rounded) weights, the AVX-512 and scalar loops bit for bit, rows independent of the batch
// and of the thread count, and int8 quantisation's bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm_lowp.h"

using namespace loom;
using namespace loom::cpu;

namespace {

std::vector<float> randn(size_t n, uint64_t key, float std = 1.f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std * normal_at(7, key, i);
  return v;
}

// y = x W^T + b in double from fp32 weights (already rounded or dequantised), with the error
// bound of fp32 accumulation: |y - ref| <= 2 K eps sum_k |x w| (+ rounding of the bias).
void check_against_reference(const std::vector<float>& y, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<float>& b, int M, int K,
                             int N) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = b.empty() ? 0 : b[size_t(n)], mag = std::fabs(ref);
      for (int k = 0; k < K; ++k) {
        const double p = double(x[size_t(m) * K + k]) * w[size_t(n) * K + k];
        ref += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(y[size_t(m) * N + n], ref, 2.0 * K * 1.2e-7 * mag + 1e-30)
          << "m " << m << " n " << n << " M " << M << " K " << K;
    }
}

struct Restore {
  bool avx = lowp_uses_avx512();
  ~Restore() { set_lowp_avx512(avx); }
};

}  // namespace

TEST(GemmLowp, Bf16WeightsMatchTheReferenceOnRoundedWeights) {
  for (int M : {1, 3, 9, 16, 17, 40})
    for (int K : {37, 64, 200})
      for (int N : {5, 33}) {
        std::vector<float> x = randn(size_t(M) * K, 1), w = randn(size_t(N) * K, 2, 0.1f),
                           b = randn(size_t(N), 3);
        std::vector<uint16_t> wb(w.size());
        for (size_t i = 0; i < w.size(); ++i) {
          wb[i] = f32_to_bf16(w[i]);
          w[i] = bf16_to_f32(wb[i]);
        }
        std::vector<float> y(size_t(M) * N, -1.f);
        gemv_f32w(y.data(), x.data(), w.data(), b.data(), M, K, N);  // fp32 weights, any M
        check_against_reference(y, x, w, b, M, K, N);
        linear_bf16w(y.data(), x.data(), wb.data(), b.data(), M, K, N);
        check_against_reference(y, x, w, b, M, K, N);
        linear_bf16w(y.data(), x.data(), wb.data(), nullptr, M, K, N);
        check_against_reference(y, x, w, {}, M, K, N);
      }
}

TEST(GemmLowp, Int8QuantisationIsBoundedAndTheProductMatchesTheReference) {
  const int N = 19, K = 130;
  std::vector<float> w = randn(size_t(N) * K, 4, 0.05f);
  for (int k = 0; k < K; ++k) w[size_t(3) * K + k] = 0;  // an all-zero row: scale 1, q 0
  std::vector<int8_t> q(w.size());
  std::vector<float> s(static_cast<size_t>(N));
  quantize_int8_rows(w.data(), N, K, q.data(), s.data());
  EXPECT_EQ(s[3], 1.f);
  std::vector<float> deq(w.size());
  for (int n = 0; n < N; ++n) {
    float mx = 0;
    for (int k = 0; k < K; ++k) mx = std::max(mx, std::fabs(w[size_t(n) * K + k]));
    if (n != 3) {
      EXPECT_FLOAT_EQ(s[size_t(n)], mx / 127);
    }
    for (int k = 0; k < K; ++k) {
      const size_t i = size_t(n) * K + k;
      ASSERT_LE(std::abs(int(q[i])), 127);
      deq[i] = s[size_t(n)] * q[i];
      ASSERT_LE(std::fabs(deq[i] - w[i]), 0.5f * s[size_t(n)] * 1.0001f);
    }
  }
  for (int M : {1, 7, 16, 33}) {
    std::vector<float> x = randn(size_t(M) * K, 5), b = randn(size_t(N), 6);
    std::vector<float> y(size_t(M) * N);
    linear_int8w(y.data(), x.data(), q.data(), s.data(), b.data(), M, K, N);
    // The scale multiplies the finished sum: one more rounding than the reference's.
    check_against_reference(y, x, deq, b, M, K, N);
  }
}

TEST(GemmLowp, Avx512AndScalarLoopsGiveTheSameBits) {
  Restore restore;
  if (!lowp_uses_avx512()) GTEST_SKIP() << "this CPU has no AVX-512";
  const int M = 11, K = 301, N = 40;
  std::vector<float> x = randn(size_t(M) * K, 8), w = randn(size_t(N) * K, 9), b = randn(N, 10);
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  std::vector<int8_t> q(w.size());
  std::vector<float> s(static_cast<size_t>(N));
  quantize_int8_rows(w.data(), N, K, q.data(), s.data());
  std::vector<float> a(size_t(M) * N), c(a.size()), a8(a.size()), c8(a.size());
  linear_bf16w(a.data(), x.data(), wb.data(), b.data(), M, K, N);
  linear_int8w(a8.data(), x.data(), q.data(), s.data(), b.data(), M, K, N);
  set_lowp_avx512(false);
  linear_bf16w(c.data(), x.data(), wb.data(), b.data(), M, K, N);
  linear_int8w(c8.data(), x.data(), q.data(), s.data(), b.data(), M, K, N);
  EXPECT_EQ(a, c);
  EXPECT_EQ(a8, c8);
}

// A decode's logits must not depend on what else is batched (seeded sampling) nor on threads.
TEST(GemmLowp, RowsDoNotDependOnTheBatchOrThreads) {
  const int M = 16, K = 96, N = 70000 / 96;  // past the threshold that splits rows over threads
  std::vector<float> x = randn(size_t(M) * K, 11), w = randn(size_t(N) * K, 12);
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  std::vector<float> all(size_t(M) * N), one(static_cast<size_t>(N));
  linear_bf16w(all.data(), x.data(), wb.data(), nullptr, M, K, N);
  for (int m : {0, 5, 15}) {
    linear_bf16w(one.data(), x.data() + size_t(m) * K, wb.data(), nullptr, 1, K, N);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + long(m) * N)) << m;
  }
  const int t = num_threads();
  set_num_threads(1);
  std::vector<float> serial(all.size());
  linear_bf16w(serial.data(), x.data(), wb.data(), nullptr, M, K, N);
  set_num_threads(t);
  EXPECT_EQ(serial, all);
}
