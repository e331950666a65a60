// CPU kernels (all ops but attention) against float64 references: forward results directly,
// backward results against central differences of the reference. Also the conventions every
// backward op follows (parameter gradients accumulate, input gradients are overwritten: each
// backward runs twice onto NaN-filled input grads), error handling, and determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/simd_math.h"
#include "kernels/grad_check.h"
#include "kernels/reference_ops.h"
#include "same_bits.h"

namespace loom {
namespace {

using test::all_close;
using test::dot;
using test::minus;
using test::numeric_gradient;
using test::random_floats;
using test::random_ints;
using test::to_f64;
using test::Vec;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Backend& be() {
  return cpu_backend();
}

// Runs fn with OpenMP limited to n threads, then restores the previous limit.
template <typename Fn>
void with_threads(int n, Fn fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(saved);
}

Vec scaled(const Vec& v, double s) {
  Vec r(v);
  for (double& x : r) x *= s;
  return r;
}

// ---------------------------------------------------------------------------------- gemm

TEST(Gemm, AllTransposesWithAlphaBetaAndPaddedStrides) {
  const int M = 7, N = 9, K = 11;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int a_rows = ta ? K : M, a_cols = ta ? M : K;
      const int b_rows = tb ? N : K, b_cols = tb ? K : N;
      const int lda = a_cols + 3, ldb = b_cols + 2, ldc = N + 5;
      auto A = random_floats(a_rows * lda, 1), B = random_floats(b_rows * ldb, 2);
      auto C = random_floats(M * ldc, 3);
      Vec expected = to_f64(C);  // padding columns of C must stay as they are
      ref::gemm(ta, tb, M, N, K, 1.5, to_f64(A), lda, to_f64(B), ldb, 0.5, expected, ldc);
      be().gemm(ta, tb, M, N, K, 1.5f, A.data(), lda, B.data(), ldb, 0.5f, C.data(), ldc);
      EXPECT_TRUE(all_close(C, expected, 1e-5, 1e-5)) << "trans_a=" << ta << " trans_b=" << tb;
    }
  }
}

TEST(Gemm, BetaZeroIgnoresOldContents) {
  const int M = 5, N = 6, K = 4;
  auto A = random_floats(M * K, 4), B = random_floats(K * N, 5);
  std::vector<float> C(M * N, kNaN);
  Vec expected(M * N, 0.0);
  ref::gemm(false, false, M, N, K, 1.0, to_f64(A), K, to_f64(B), N, 0.0, expected, N);
  be().gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  EXPECT_TRUE(all_close(C, expected, 1e-6, 1e-6));
}

TEST(Gemm, EmptyInnerDimensionScalesC) {
  const float dummy = 0.0f;
  std::vector<float> C = {1, 2, 3, 4, 5, 6};
  be().gemm(false, false, 2, 3, 0, 1.0f, &dummy, 1, &dummy, 3, 2.0f, C.data(), 3);
  EXPECT_TRUE(all_close(C, Vec{2, 4, 6, 8, 10, 12}, 0, 0));
  std::fill(C.begin(), C.end(), kNaN);
  be().gemm(false, false, 2, 3, 0, 1.0f, &dummy, 1, &dummy, 3, 0.0f, C.data(), 3);
  EXPECT_TRUE(all_close(C, Vec(6, 0.0), 0, 0));
}

TEST(Gemm, BadLeadingDimensionIsAnError) {
  std::vector<float> A(16), B(16), C(16);
  EXPECT_THROW(be().gemm(false, false, 4, 4, 4, 1.0f, A.data(), 3, B.data(), 4, 0.0f, C.data(), 4),
               Error);
}

TEST(Gemm, BatchedMatchesPerMatrixReference) {
  struct Case {
    int M, N, K;
    bool ta, tb;
  };
  // The first case runs one single-threaded GEMM per OpenMP thread, the second lets OpenBLAS
  // thread each GEMM (M*N*K above its single-thread threshold).
  for (const Case& c : {Case{6, 5, 4, false, true}, Case{70, 66, 64, true, false}}) {
    const int batch = 3;
    const int lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N, ldc = c.N;
    const int64_t sa = int64_t{c.M} * c.K + 7, sb = int64_t{c.K} * c.N + 3,
                  sc = int64_t{c.M} * c.N + 5;
    auto A = random_floats(sa * batch, 6), B = random_floats(sb * batch, 7);
    auto C = random_floats(sc * batch, 8);
    const Vec A64 = to_f64(A), B64 = to_f64(B);
    Vec expected = to_f64(C);
    for (int b = 0; b < batch; ++b) {
      Vec a(A64.begin() + b * sa, A64.begin() + (b + 1) * sa);
      Vec bm(B64.begin() + b * sb, B64.begin() + (b + 1) * sb);
      Vec cm(expected.begin() + b * sc, expected.begin() + (b + 1) * sc);
      ref::gemm(c.ta, c.tb, c.M, c.N, c.K, 0.5, a, lda, bm, ldb, 1.0, cm, ldc);
      std::copy(cm.begin(), cm.end(), expected.begin() + b * sc);
    }
    be().gemm_batched(c.ta, c.tb, c.M, c.N, c.K, 0.5f, A.data(), lda, sa, B.data(), ldb, sb, 1.0f,
                      C.data(), ldc, sc, batch);
    EXPECT_TRUE(all_close(C, expected, 1e-5, 1e-5)) << "M=" << c.M;
  }
}

// ---------------------------------------------------------------------------------- matmul

TEST(Matmul, ForwardMatchesReferenceWithAndWithoutBias) {
  const int N = 33, IC = 40, OC = 24;
  auto inp = random_floats(N * IC, 10), w = random_floats(OC * IC, 11), b = random_floats(OC, 12);
  for (bool with_bias : {true, false}) {
    std::vector<float> out(N * OC, kNaN);
    be().matmul_forward(out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, N, IC,
                        OC);
    const Vec expected =
        ref::matmul(to_f64(inp), to_f64(w), with_bias ? to_f64(b) : Vec{}, N, IC, OC);
    EXPECT_TRUE(all_close(out, expected, 1e-5, 1e-5)) << "bias=" << with_bias;
  }
}

TEST(Matmul, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 5, IC = 7, OC = 6;
  auto inp = random_floats(N * IC, 20), w = random_floats(OC * IC, 21), b = random_floats(OC, 22);
  auto dout = random_floats(N * OC, 23);  // L = sum(out * dout)
  const Vec x64 = to_f64(inp), w64 = to_f64(w), b64 = to_f64(b), d64 = to_f64(dout);
  const Vec g_inp = numeric_gradient(
      [&](const Vec& x) { return dot(ref::matmul(x, w64, b64, N, IC, OC), d64); }, x64);
  const Vec g_w = numeric_gradient(
      [&](const Vec& wv) { return dot(ref::matmul(x64, wv, b64, N, IC, OC), d64); }, w64);
  const Vec g_b = numeric_gradient(
      [&](const Vec& bv) { return dot(ref::matmul(x64, w64, bv, N, IC, OC), d64); }, b64);

  std::vector<float> dinp(N * IC, kNaN);
  const auto dw0 = random_floats(OC * IC, 24), db0 = random_floats(OC, 25);
  auto dw = dw0, db = db0;
  for (int call = 1; call <= 2; ++call) {
    be().matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N,
                         IC, OC);
    EXPECT_TRUE(all_close(dinp, g_inp, 1e-5, 1e-4)) << "dinp is written, call " << call;
    EXPECT_TRUE(all_close(minus(dw, dw0), scaled(g_w, call), 1e-5, 1e-4)) << "call " << call;
    EXPECT_TRUE(all_close(minus(db, db0), scaled(g_b, call), 1e-5, 1e-4)) << "call " << call;
  }
  // dinp may be skipped.
  auto dw2 = dw0;
  be().matmul_backward(nullptr, dw2.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC, OC);
  EXPECT_TRUE(all_close(minus(dw2, dw0), g_w, 1e-5, 1e-4));
}

TEST(Matmul, BiasGradientBitsIndependentOfThreadCount) {
  const int N = 300, IC = 8, OC = 200;  // N * OC above the parallel threshold
  auto inp = random_floats(N * IC, 26), w = random_floats(OC * IC, 27);
  auto dout = random_floats(N * OC, 28);
  std::vector<float> db1(OC, 0.0f), db2(OC, 0.0f);
  with_threads(1, [&] {
    be().matmul_backward(nullptr, nullptr, db1.data(), dout.data(), inp.data(), w.data(), N, IC,
                         OC);
  });
  with_threads(2, [&] {
    be().matmul_backward(nullptr, nullptr, db2.data(), dout.data(), inp.data(), w.data(), N, IC,
                         OC);
  });
  EXPECT_TRUE(loom::test::same_bits(db1, db2));
}

// ---------------------------------------------------------------------------------- embedding

TEST(Embedding, ForwardWritesOrAccumulatesRows) {
  // The small case runs serially, the large one on OpenMP threads.
  for (auto [N, C] : {std::pair{8, 19}, std::pair{512, 128}}) {
    const int V = 11;
    auto table = random_floats(V * C, 30);
    auto ids = random_ints(N, 31, 0, V - 1);
    auto out = random_floats(N * C, 32);
    const auto before = out;
    be().embedding_forward(out.data(), ids.data(), table.data(), N, C, /*accumulate=*/true);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C; ++c)
        ASSERT_EQ(out[i * C + c], before[i * C + c] + table[ids[i] * C + c]) << i << "," << c;
    be().embedding_forward(out.data(), ids.data(), table.data(), N, C, /*accumulate=*/false);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C; ++c) ASSERT_EQ(out[i * C + c], table[ids[i] * C + c]) << i << "," << c;
  }
}

Vec embedding_backward_reference(const std::vector<float>& dtable0, const std::vector<float>& dout,
                                 const std::vector<int32_t>& ids, int C) {
  Vec expected = to_f64(dtable0);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int c = 0; c < C; ++c) expected[ids[i] * C + c] += dout[i * C + c];
  return expected;
}

TEST(Embedding, BackwardScatterAddsIntoTable) {
  const int N = 40, V = 5, C = 23;  // many repeated ids
  auto ids = random_ints(N, 33, 0, V - 1);
  auto dout = random_floats(N * C, 34);
  const auto dtable0 = random_floats(V * C, 35);
  auto dtable = dtable0;
  be().embedding_backward(dtable.data(), dout.data(), ids.data(), N, C);
  EXPECT_TRUE(all_close(dtable, embedding_backward_reference(dtable0, dout, ids, C), 1e-5, 1e-5));
}

TEST(Embedding, BackwardBitsIndependentOfThreadCount) {
  const int N = 4096, V = 7, C = 100;  // C not a multiple of the 16-float split unit
  auto ids = random_ints(N, 36, 0, V - 1);
  auto dout = random_floats(N * C, 37);
  const auto dtable0 = random_floats(V * C, 38);
  auto d1 = dtable0, d2 = dtable0, d2again = dtable0;
  with_threads(1, [&] { be().embedding_backward(d1.data(), dout.data(), ids.data(), N, C); });
  with_threads(2, [&] { be().embedding_backward(d2.data(), dout.data(), ids.data(), N, C); });
  with_threads(2, [&] { be().embedding_backward(d2again.data(), dout.data(), ids.data(), N, C); });
  EXPECT_TRUE(loom::test::same_bits(d1, d2));
  EXPECT_TRUE(loom::test::same_bits(d2, d2again));
  EXPECT_TRUE(all_close(d2, embedding_backward_reference(dtable0, dout, ids, C), 1e-4, 1e-5));
}

TEST(Embedding, NegativeIdIsAnError) {
  std::vector<float> table(12), out(8);
  std::vector<int32_t> ids = {1, -1};
  EXPECT_THROW(be().embedding_forward(out.data(), ids.data(), table.data(), 2, 4, false), Error);
  EXPECT_THROW(be().embedding_backward(table.data(), out.data(), ids.data(), 2, 4), Error);
}

// ---------------------------------------------------------------------------------- layernorm

TEST(LayerNorm, ForwardMatchesReference) {
  for (auto [N, C] : {std::pair{5, 37}, std::pair{64, 768}}) {
    auto x = random_floats(N * C, 40, -2, 2), w = random_floats(C, 41, 0.5, 1.5);
    auto b = random_floats(C, 42);
    for (bool with_bias : {true, false}) {
      std::vector<float> out(N * C, kNaN), mean(N, kNaN), rstd(N, kNaN);
      be().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                             with_bias ? b.data() : nullptr, N, C, 1e-5f);
      const auto r =
          ref::layernorm(to_f64(x), to_f64(w), with_bias ? to_f64(b) : Vec{}, N, C, 1e-5);
      EXPECT_TRUE(all_close(out, r.out, 1e-5, 1e-5)) << "C=" << C << " bias=" << with_bias;
      EXPECT_TRUE(all_close(mean, r.mean, 1e-6, 1e-5));
      EXPECT_TRUE(all_close(rstd, r.rstd, 1e-6, 1e-5));
    }
  }
}

TEST(LayerNorm, ForwardRobustToLargeMean) {
  // Rows with mean 300 and std ~0.6: a one-pass E[x^2] - E[x]^2 in float loses ~1% of the
  // variance here; the two-pass kernel stays near float rounding of the inputs.
  const int N = 4, C = 256;
  auto x = random_floats(N * C, 43, 299, 301);
  std::vector<float> w(C, 1.0f), out(N * C), mean(N), rstd(N);
  be().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C,
                         1e-5f);
  const auto r = ref::layernorm(to_f64(x), to_f64(w), Vec{}, N, C, 1e-5);
  EXPECT_TRUE(all_close(out, r.out, 5e-4, 0));
  EXPECT_TRUE(all_close(rstd, r.rstd, 0, 1e-4));
}

// Shapes for the backward checks: a few wide rows, and more rows than the 64 row blocks the
// parameter-gradient reduction uses (so blocks hold several rows).
const std::pair<int, int> kNormGradShapes[] = {{3, 37}, {130, 5}};

TEST(LayerNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  for (auto [N, C] : kNormGradShapes) {
    auto x = random_floats(N * C, 44, -2, 2), w = random_floats(C, 45, 0.5, 1.5);
    auto b = random_floats(C, 46), dout = random_floats(N * C, 47);
    const Vec x64 = to_f64(x), w64 = to_f64(w), b64 = to_f64(b), d64 = to_f64(dout);
    const double eps = 1e-5;
    auto loss = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
      return dot(ref::layernorm(xv, wv, bv, N, C, eps).out, d64);
    };
    const Vec g_x = numeric_gradient([&](const Vec& v) { return loss(v, w64, b64); }, x64);
    const Vec g_w = numeric_gradient([&](const Vec& v) { return loss(x64, v, b64); }, w64);
    const Vec g_b = numeric_gradient([&](const Vec& v) { return loss(x64, w64, v); }, b64);

    std::vector<float> out(N * C), mean(N), rstd(N);
    be().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                           static_cast<float>(eps));
    std::vector<float> dx(N * C, kNaN);
    const auto dw0 = random_floats(C, 48), db0 = random_floats(C, 49);
    auto dw = dw0, db = db0;
    for (int call = 1; call <= 2; ++call) {
      be().layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
      EXPECT_TRUE(all_close(dx, g_x, 1e-5, 1e-4)) << "call " << call;
      EXPECT_TRUE(all_close(minus(dw, dw0), scaled(g_w, call), 1e-5, 1e-4)) << "call " << call;
      EXPECT_TRUE(all_close(minus(db, db0), scaled(g_b, call), 1e-5, 1e-4)) << "call " << call;
    }
  }
}

TEST(LayerNorm, BackwardMayWriteInputGradientOverOutputGradient) {
  const int N = 70, C = 40;
  auto x = random_floats(N * C, 53), w = random_floats(C, 54), dout = random_floats(N * C, 55);
  std::vector<float> out(N * C), mean(N), rstd(N);
  be().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C,
                         1e-5f);
  std::vector<float> dx(N * C), dw1(C, 0.0f), db1(C, 0.0f), dw2(C, 0.0f), db2(C, 0.0f);
  be().layernorm_backward(dx.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  auto inplace = dout;
  be().layernorm_backward(inplace.data(), dw2.data(), db2.data(), inplace.data(), x.data(),
                          w.data(), mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(loom::test::same_bits(dx, inplace));
  EXPECT_TRUE(loom::test::same_bits(dw1, dw2));
  EXPECT_TRUE(loom::test::same_bits(db1, db2));

  std::vector<float> rdx(N * C), rdw1(C, 0.0f), rdw2(C, 0.0f);  // RMSNorm likewise
  be().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  be().rmsnorm_backward(rdx.data(), rdw1.data(), dout.data(), x.data(), w.data(), rstd.data(), N,
                        C);
  inplace = dout;
  be().rmsnorm_backward(inplace.data(), rdw2.data(), inplace.data(), x.data(), w.data(),
                        rstd.data(), N, C);
  EXPECT_TRUE(loom::test::same_bits(rdx, inplace));
  EXPECT_TRUE(loom::test::same_bits(rdw1, rdw2));
}

TEST(LayerNorm, BackwardBitsIndependentOfThreadCount) {
  const int N = 500, C = 100;
  auto x = random_floats(N * C, 50), w = random_floats(C, 51), dout = random_floats(N * C, 52);
  std::vector<float> out(N * C), mean(N), rstd(N);
  be().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C,
                         1e-5f);
  std::vector<float> dx1(N * C), dw1(C, 0.0f), db1(C, 0.0f), dx2(N * C), dw2(C, 0.0f), db2(C, 0.0f);
  with_threads(1, [&] {
    be().layernorm_backward(dx1.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), N, C);
  });
  with_threads(2, [&] {
    be().layernorm_backward(dx2.data(), dw2.data(), db2.data(), dout.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), N, C);
  });
  EXPECT_TRUE(loom::test::same_bits(dx1, dx2));
  EXPECT_TRUE(loom::test::same_bits(dw1, dw2));
  EXPECT_TRUE(loom::test::same_bits(db1, db2));
}

// ---------------------------------------------------------------------------------- rmsnorm

TEST(RMSNorm, ForwardMatchesReference) {
  for (auto [N, C] : {std::pair{5, 37}, std::pair{64, 768}}) {
    auto x = random_floats(N * C, 60, -2, 2), w = random_floats(C, 61, 0.5, 1.5);
    std::vector<float> out(N * C, kNaN), rstd(N, kNaN);
    be().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    const auto r = ref::rmsnorm(to_f64(x), to_f64(w), N, C, 1e-6);
    EXPECT_TRUE(all_close(out, r.out, 1e-5, 1e-5)) << "C=" << C;
    EXPECT_TRUE(all_close(rstd, r.rstd, 1e-6, 1e-5));
  }
}

TEST(RMSNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  for (auto [N, C] : kNormGradShapes) {
    auto x = random_floats(N * C, 62, -2, 2), w = random_floats(C, 63, 0.5, 1.5);
    auto dout = random_floats(N * C, 64);
    const Vec x64 = to_f64(x), w64 = to_f64(w), d64 = to_f64(dout);
    const double eps = 1e-6;
    const Vec g_x = numeric_gradient(
        [&](const Vec& v) { return dot(ref::rmsnorm(v, w64, N, C, eps).out, d64); }, x64);
    const Vec g_w = numeric_gradient(
        [&](const Vec& v) { return dot(ref::rmsnorm(x64, v, N, C, eps).out, d64); }, w64);
    std::vector<float> out(N * C), rstd(N);
    be().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C,
                         static_cast<float>(eps));
    std::vector<float> dx(N * C, kNaN);
    const auto dw0 = random_floats(C, 65);
    auto dw = dw0;
    for (int call = 1; call <= 2; ++call) {
      be().rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N,
                            C);
      EXPECT_TRUE(all_close(dx, g_x, 1e-5, 1e-4)) << "call " << call;
      EXPECT_TRUE(all_close(minus(dw, dw0), scaled(g_w, call), 1e-5, 1e-4)) << "call " << call;
    }
  }
}

// ---------------------------------------------------------------------------------- gelu, swiglu

TEST(Gelu, ForwardMatchesReferenceIncludingTails) {
  auto x = random_floats(100003, 70, -6, 6);  // above the parallel threshold
  for (float special : {-100.0f, -20.0f, -1e-8f, 0.0f, 1e-8f, 20.0f, 100.0f}) x.push_back(special);
  std::vector<float> out(x.size(), kNaN);
  be().gelu_forward(out.data(), x.data(), static_cast<int64_t>(x.size()));
  EXPECT_TRUE(all_close(out, ref::gelu(to_f64(x)), 1e-6, 1e-5));
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  auto x = random_floats(64, 71, -5, 5);
  auto dout = random_floats(64, 72);
  const Vec d64 = to_f64(dout);
  const Vec g = numeric_gradient([&](const Vec& v) { return dot(ref::gelu(v), d64); }, to_f64(x));
  std::vector<float> dx(x.size(), kNaN);
  be().gelu_backward(dx.data(), x.data(), dout.data(), static_cast<int64_t>(x.size()));
  EXPECT_TRUE(all_close(dx, g, 1e-6, 1e-5));
}

TEST(SwiGLU, ForwardMatchesReference) {
  const int N = 4, F = 13;
  auto inp = random_floats(N * 2 * F, 73, -8, 8);
  inp[0] = -100.0f;  // saturated gates
  inp[1] = 100.0f;
  std::vector<float> out(N * F, kNaN);
  be().swiglu_forward(out.data(), inp.data(), N, F);
  EXPECT_TRUE(all_close(out, ref::swiglu(to_f64(inp), N, F), 1e-6, 1e-5));
}

TEST(SwiGLU, BackwardMatchesFiniteDifferences) {
  const int N = 4, F = 13;
  auto inp = random_floats(N * 2 * F, 74, -6, 6), dout = random_floats(N * F, 75);
  const Vec d64 = to_f64(dout);
  const Vec g =
      numeric_gradient([&](const Vec& v) { return dot(ref::swiglu(v, N, F), d64); }, to_f64(inp));
  std::vector<float> dinp(N * 2 * F, kNaN);
  be().swiglu_backward(dinp.data(), inp.data(), dout.data(), N, F);
  EXPECT_TRUE(all_close(dinp, g, 1e-6, 1e-5));
}

// ---------------------------------------------------------------------------------- rope

struct RopeCase {
  int N, H, D, ld;
};
const RopeCase kRopeCases[] = {{5, 3, 8, 3 * 8 + 4}, {3, 2, 160, 2 * 160}};  // D/2 > 64: blocked

std::vector<int32_t> rope_positions(int N) {
  std::vector<int32_t> pos = {0, 1, 7, 100, 5000};
  pos.resize(N);
  return pos;
}

TEST(Rope, ForwardMatchesReferenceAndLeavesRowPaddingAlone) {
  for (const RopeCase& c : kRopeCases) {
    const auto pos = rope_positions(c.N);
    auto x = random_floats(c.N * c.ld, 80);
    const Vec expected = ref::rope(to_f64(x), pos, c.N, c.H, c.D, c.ld, 10000.0);
    be().rope_forward(x.data(), pos.data(), c.N, c.H, c.D, c.ld, 10000.0f);
    EXPECT_TRUE(all_close(x, expected, 2e-6, 1e-5)) << "D=" << c.D;
  }
}

TEST(Rope, BackwardMatchesFiniteDifferencesAndInvertsForward) {
  for (const RopeCase& c : kRopeCases) {
    const auto pos = rope_positions(c.N);
    const auto x = random_floats(c.N * c.ld, 81);
    const auto dout = random_floats(c.N * c.ld, 82);
    const Vec d64 = to_f64(dout);
    const Vec g = numeric_gradient(
        [&](const Vec& v) { return dot(ref::rope(v, pos, c.N, c.H, c.D, c.ld, 10000.0), d64); },
        to_f64(x));
    auto dx = dout;
    be().rope_backward(dx.data(), pos.data(), c.N, c.H, c.D, c.ld, 10000.0f);
    EXPECT_TRUE(all_close(dx, g, 2e-6, 1e-5)) << "D=" << c.D;

    auto y = x;
    be().rope_forward(y.data(), pos.data(), c.N, c.H, c.D, c.ld, 10000.0f);
    be().rope_backward(y.data(), pos.data(), c.N, c.H, c.D, c.ld, 10000.0f);
    EXPECT_TRUE(all_close(y, to_f64(x), 1e-6, 1e-6)) << "round trip, D=" << c.D;
  }
}

// Llama 3.1's frequency scaling, transcribed step by step from transformers'
// _compute_llama3_parameters (wavelengths, the two thresholds, the smooth blend in between).
std::vector<double> llama3_inv_freq(int D, double theta, double factor, double low, double high,
                                    double old_ctx) {
  std::vector<double> out(D / 2);
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  for (int j = 0; j < D / 2; ++j) {
    const double f = 1.0 / std::pow(theta, 2.0 * j / D);
    const double wavelen = 2 * M_PI / f;
    double scaled = wavelen > low_wavelen ? f / factor : f;
    const double smooth = (old_ctx / wavelen - low) / (high - low);
    const double smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    out[j] = medium ? smoothed : scaled;
  }
  return out;
}

TEST(Rope, Llama3ScalingMatchesTheTransformersFormula) {
  const int N = 5, H = 2, D = 160, ld = H * D;
  const RopeScaling s{8.f, 1.f, 4.f, 64};  // wavelengths 2pi..5.7e4 cross both thresholds
  const auto inv = llama3_inv_freq(D, 10000.0, 8, 1, 4, 64);
  int kept = 0, scaled = 0;
  for (int j = 0; j < D / 2; ++j) {
    const double f = std::pow(10000.0, -2.0 * j / D);
    kept += inv[j] == f;
    scaled += std::abs(inv[j] - f / 8) < 1e-15;
  }
  ASSERT_GT(kept, 0);
  ASSERT_GT(scaled, 0);
  ASSERT_LT(kept + scaled, D / 2);  // some frequencies are blended
  const auto pos = rope_positions(N);
  auto x = random_floats(N * ld, 83);
  Vec expected = to_f64(x);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < D / 2; ++j) {
        const double angle = pos[n] * inv[j];
        double& a = expected[size_t(n) * ld + h * D + j];
        double& b = expected[size_t(n) * ld + h * D + j + D / 2];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(angle) - b0 * std::sin(angle);
        b = b0 * std::cos(angle) + a0 * std::sin(angle);
      }
  auto y = x;
  be().rope_forward_scaled(y.data(), pos.data(), N, H, D, ld, 10000.0f, s);
  EXPECT_TRUE(all_close(y, expected, 2e-6, 1e-5));
  be().rope_backward_scaled(y.data(), pos.data(), N, H, D, ld, 10000.0f, s);
  EXPECT_TRUE(all_close(y, to_f64(x), 1e-6, 1e-6)) << "backward undoes forward";
  // Unscaled through the same entry point is the plain rotation.
  auto z = x, w = x;
  be().rope_forward_scaled(z.data(), pos.data(), N, H, D, ld, 10000.0f, RopeScaling{});
  be().rope_forward(w.data(), pos.data(), N, H, D, ld, 10000.0f);
  EXPECT_EQ(z, w);
  EXPECT_THROW(be().rope_forward_scaled(y.data(), pos.data(), N, H, D, ld, 10000.0f,
                                        RopeScaling{8.f, 4.f, 1.f, 64}),
               Error);  // low_freq_factor above high_freq_factor
}

TEST(Rope, BadShapesAreErrors) {
  std::vector<float> x(64);
  std::vector<int32_t> pos = {0, 1};
  EXPECT_THROW(be().rope_forward(x.data(), pos.data(), 2, 2, 7, 14, 10000.0f), Error);  // odd D
  EXPECT_THROW(be().rope_forward(x.data(), pos.data(), 2, 2, 8, 15, 10000.0f), Error);  // ld < H*D
}

// ---------------------------------------------------------------------------------- add, scale

TEST(Pointwise, AddAndScaleAreExactElementwise) {
  for (int64_t n : {int64_t{37}, int64_t{100003}}) {
    const auto a = random_floats(n, 90), b = random_floats(n, 91);
    std::vector<float> out(n, kNaN);
    be().add(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
    auto acc = a;
    be().add_inplace(acc.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], a[i] + b[i]) << i;
    auto s = a;
    be().scale_inplace(s.data(), -0.37f, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(s[i], a[i] * -0.37f) << i;
  }
}

// ---------------------------------------------------------------------------------- softmax

TEST(Softmax, ForwardMatchesReferenceWithLargeAndMaskedValues) {
  const int rows = 4, cols = 37;
  auto x = random_floats(rows * cols, 100, -3, 3);
  for (int j = 0; j < cols; ++j) x[2 * cols + j] *= 50.0f;  // wide range
  x[3 * cols + 0] = -kInf;                                  // masked entries
  x[3 * cols + 5] = -kInf;
  std::vector<float> out(rows * cols, kNaN);
  be().softmax_forward(out.data(), x.data(), rows, cols);
  EXPECT_TRUE(all_close(out, ref::softmax(to_f64(x), rows, cols), 1e-7, 1e-5));

  std::vector<float> masked(cols, -kInf), y(cols, kNaN);  // a fully masked row gives zeros
  be().softmax_forward(y.data(), masked.data(), 1, cols);
  EXPECT_TRUE(all_close(y, Vec(cols, 0.0), 0, 0));
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  const int rows = 3, cols = 29;
  auto x = random_floats(rows * cols, 101, -3, 3), dout = random_floats(rows * cols, 102);
  const Vec d64 = to_f64(dout);
  const Vec g = numeric_gradient(
      [&](const Vec& v) { return dot(ref::softmax(v, rows, cols), d64); }, to_f64(x));
  std::vector<float> out(rows * cols), dx(rows * cols, kNaN);
  be().softmax_forward(out.data(), x.data(), rows, cols);
  be().softmax_backward(dx.data(), out.data(), dout.data(), rows, cols);
  EXPECT_TRUE(all_close(dx, g, 1e-6, 1e-5));
}

// ---------------------------------------------------------------------------------- cross-entropy

TEST(CrossEntropy, LossAndGradientMatchReference) {
  const int N = 6, V = 37;
  const float dloss = 0.25f;
  auto logits = random_floats(N * V, 110, -4, 4);
  const std::vector<int32_t> targets = {3, -1, 0, 36, 5, -7};  // rows 1 and 5 are ignored
  const Vec l64 = to_f64(logits);
  std::vector<float> losses(N, kNaN), dlogits(N * V, kNaN);
  be().cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, dloss,
                     nullptr);
  EXPECT_TRUE(all_close(losses, ref::cross_entropy(l64, targets, N, V), 1e-6, 1e-5));
  EXPECT_EQ(losses[1], 0.0f);
  EXPECT_EQ(losses[5], 0.0f);
  const Vec g = numeric_gradient(
      [&](const Vec& v) {
        const Vec l = ref::cross_entropy(v, targets, N, V);
        return dloss * dot(l, Vec(N, 1.0));
      },
      l64);
  EXPECT_TRUE(all_close(dlogits, g, 1e-7, 1e-5));  // zeros on ignored rows included
}

// Per-row weights scale each row's gradient (negative weights included, as DPO and GRPO use);
// the reported losses stay unweighted.
TEST(CrossEntropy, RowWeightsScaleEachRowsGradient) {
  const int N = 5, V = 29;
  const float dloss = 0.5f;
  const auto logits = random_floats(N * V, 114, -3, 3);
  const std::vector<int32_t> targets = {2, 28, -1, 0, 7};
  const std::vector<float> w = {1.0f, 0.0f, 3.0f, -2.5f, 0.125f};
  const Vec l64 = to_f64(logits);
  std::vector<float> losses(N, kNaN), dlogits(N * V, kNaN);
  be().cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, dloss,
                     w.data());
  EXPECT_TRUE(all_close(losses, ref::cross_entropy(l64, targets, N, V), 1e-6, 1e-5));
  const Vec g = numeric_gradient(
      [&](const Vec& v) {
        const Vec l = ref::cross_entropy(v, targets, N, V);
        double s = 0;
        for (int i = 0; i < N; ++i) s += dloss * w[i] * l[i];
        return s;
      },
      l64);
  EXPECT_TRUE(all_close(dlogits, g, 1e-7, 1e-5));
  for (int j = 0; j < V; ++j) EXPECT_EQ(dlogits[1 * V + j], 0.0f);  // weight 0: no gradient
}

TEST(CrossEntropy, StableForHugeLogitsAndLargeVocabulary) {
  const int N = 3, V = 50304;
  auto logits = random_floats(N * V, 111, -10, 10);
  for (int j = 0; j < V; ++j) logits[j] = logits[j] * 1000.0f + 5000.0f;  // row 0: |x| ~ 1e4
  const std::vector<int32_t> targets = {17, 50303, 0};
  const Vec l64 = to_f64(logits);
  std::vector<float> losses(N), dlogits(N * V, kNaN);
  be().cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, 1.0f,
                     nullptr);
  EXPECT_TRUE(all_close(losses, ref::cross_entropy(l64, targets, N, V), 1e-4, 1e-5));
  // Analytic gradient: softmax - onehot.
  Vec expected = ref::softmax(l64, N, V);
  for (int i = 0; i < N; ++i) expected[i * V + targets[i]] -= 1.0;
  EXPECT_TRUE(all_close(dlogits, expected, 1e-9, 1e-4));
}

TEST(CrossEntropy, GradientMayOverwriteLogits) {
  const int N = 4, V = 300;
  const auto logits = random_floats(N * V, 112, -5, 5);
  const std::vector<int32_t> targets = {0, 299, -1, 150};
  std::vector<float> losses_sep(N), dlogits(N * V), losses_alias(N);
  be().cross_entropy(losses_sep.data(), dlogits.data(), logits.data(), targets.data(), N, V, 0.5f,
                     nullptr);
  auto buf = logits;
  be().cross_entropy(losses_alias.data(), buf.data(), buf.data(), targets.data(), N, V, 0.5f,
                     nullptr);
  EXPECT_TRUE(loom::test::same_bits(losses_sep, losses_alias));
  EXPECT_TRUE(loom::test::same_bits(dlogits, buf));
}

TEST(CrossEntropy, TargetOutsideVocabularyIsAnErrorWithNoOutput) {
  const int N = 3, V = 10;
  const auto logits = random_floats(N * V, 113);
  const std::vector<int32_t> targets = {1, 10, 2};
  std::vector<float> losses(N, 42.0f), dlogits(N * V, 42.0f);
  EXPECT_THROW(be().cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N,
                                  V, 1.0f, nullptr),
               Error);
  EXPECT_TRUE(all_close(losses, Vec(N, 42.0), 0, 0));
  EXPECT_TRUE(all_close(dlogits, Vec(N * V, 42.0), 0, 0));
}

// ---------------------------------------------------------------------------------- adamw

TEST(AdamW, SeveralStepsMatchReference) {
  const int64_t n = 40000;  // above the parallel threshold
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gscale = 0.5f;
  auto p = random_floats(n, 120);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  ref::AdamState s{to_f64(p), Vec(n, 0.0), Vec(n, 0.0)};
  for (int64_t step = 1; step <= 5; ++step) {
    const auto g = random_floats(n, 120 + step, -2, 2);
    be().adamw(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, gscale, step);
    ref::adamw(s, to_f64(g), lr, b1, b2, eps, wd, gscale, step);
  }
  EXPECT_TRUE(all_close(m, s.m, 1e-7, 1e-5));
  EXPECT_TRUE(all_close(v, s.v, 1e-8, 1e-5));
  // Elements whose gradients nearly cancel have an ill-conditioned update; 1e-3 lr is loose
  // for those and still far below any formula error (which shifts params by ~lr).
  EXPECT_TRUE(all_close(p, s.param, 1e-5, 1e-6));
}

TEST(AdamW, WeightDecayIsDecoupledFromTheGradient) {
  // Zero gradient: Adam's term vanishes and only p *= (1 - lr wd) remains. (L2 regularisation
  // folded into the gradient would instead move every parameter by ~lr.)
  const int64_t n = 64;
  auto p = random_floats(n, 130, 1, 2);
  const auto p0 = p;
  std::vector<float> g(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  be().adamw(p.data(), g.data(), m.data(), v.data(), n, 0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1.0f, 1);
  Vec expected(n);
  for (int64_t i = 0; i < n; ++i) expected[i] = p0[i] * (1.0 - 0.1 * 0.5);
  EXPECT_TRUE(all_close(p, expected, 0, 1e-6));
}

TEST(AdamW, FirstStepIsBiasCorrected) {
  // At step 1, mhat = g and vhat = g^2, so each parameter moves by lr * sign(g) whatever the
  // betas (uncorrected moments would move it by lr * (1-b1)/sqrt(1-b2) ~ 0.45 lr).
  const int64_t n = 64;
  std::vector<float> p(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  auto g = random_floats(n, 131, 0.1f, 1.0f);
  for (int64_t i = 0; i < n; i += 2) g[i] = -g[i];
  be().adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1);
  Vec expected(n);
  for (int64_t i = 0; i < n; ++i) expected[i] = g[i] > 0 ? -1e-3 : 1e-3;
  EXPECT_TRUE(all_close(p, expected, 0, 1e-5));
  EXPECT_THROW(
      be().adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0, 1, 0),
      Error);
}

// ---------------------------------------------------------------------------------- reductions

TEST(SumSquares, MatchesReferenceForAnyLength) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{1000003}}) {
    const auto x = random_floats(n, 140, -3, 3);
    double expected = 0.0;
    for (float f : x) expected += static_cast<double>(f) * f;
    EXPECT_NEAR(be().sum_squares(x.data(), n), expected, 1e-12 * expected) << "n=" << n;
  }
}

TEST(SumSquares, BitsIndependentOfThreadCountAndAlignment) {
  const int64_t n = 1000003;
  const auto x = random_floats(n, 141, -3, 3);
  double s1 = 0, s2 = 0;
  with_threads(1, [&] { s1 = be().sum_squares(x.data(), n); });
  with_threads(2, [&] { s2 = be().sum_squares(x.data(), n); });
  EXPECT_EQ(std::memcmp(&s1, &s2, sizeof s1), 0) << s1 << " vs " << s2;
  for (int shift = 1; shift < 4; ++shift) {  // same values at another address mod 16 bytes
    std::vector<float> moved(n + shift);
    std::copy(x.begin(), x.end(), moved.begin() + shift);
    const double s = be().sum_squares(moved.data() + shift, n);
    EXPECT_EQ(std::memcmp(&s, &s2, sizeof s), 0) << "shift " << shift;
  }
}

TEST(AllFinite, DetectsInfAndNaNAnywhere) {
  for (int64_t n : {int64_t{19}, int64_t{100003}}) {
    auto x = random_floats(n, 150, -1e30f, 1e30f);
    EXPECT_TRUE(be().all_finite(x.data(), n));
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      for (float bad : {kInf, -kInf, kNaN}) {
        auto y = x;
        y[at] = bad;
        EXPECT_FALSE(be().all_finite(y.data(), n)) << "n=" << n << " at=" << at << " " << bad;
      }
    }
  }
  EXPECT_TRUE(be().all_finite(nullptr, 0));
}

// ---------------------------------------------------------------------------------- fast_exp

TEST(FastExp, AccurateOverTheFloatRange) {
  double worst_rel = 0.0;
  for (double xd = -87.0; xd <= 88.7; xd += 1e-3) {
    const float x = static_cast<float>(xd);
    const double e = std::exp(static_cast<double>(x));
    worst_rel = std::max(worst_rel, std::abs(cpu::fast_exp(x) - e) / e);
  }
  EXPECT_LT(worst_rel, 3e-7);  // ~2.5 ulp
  // Denormal results: within one denormal step.
  for (float x : {-88.0f, -95.0f, -100.0f, -103.0f})
    EXPECT_NEAR(cpu::fast_exp(x), std::exp(static_cast<double>(x)), 1.5e-45) << x;
  EXPECT_EQ(cpu::fast_exp(-kInf), 0.0f);
  EXPECT_EQ(cpu::fast_exp(-1000.0f), 0.0f);
  EXPECT_EQ(cpu::fast_exp(kInf), kInf);
  EXPECT_EQ(cpu::fast_exp(89.0f), kInf);
  EXPECT_TRUE(std::isfinite(cpu::fast_exp(88.7f)));
  EXPECT_TRUE(std::isnan(cpu::fast_exp(kNaN)));
  EXPECT_EQ(cpu::fast_exp(0.0f), 1.0f);
}

}  // namespace
}  // namespace loom

// LoRA dropout's bit mask: bit c % 64 of word c / 64 of row n keeps element (n, c), scaled;
// rows of 70 columns use two words each (the second partial), out of place and in place.
TEST(Ops, ApplyBitMask) {
  const int N = 3, C = 70;
  const std::vector<float> x = loom::test::random_floats(size_t(N) * C, 81);
  std::vector<uint64_t> bits(size_t(N) * 2, 0);
  bits[0] = 0x5ull;       // row 0: columns 0 and 2
  bits[1] = 0x1ull << 5;  // row 0: column 69
  bits[2] = ~0ull;        // row 1: columns 0..63
  bits[5] = 0x3Full;      // row 2: columns 64..69
  std::vector<float> want(x.size(), 0.f);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      const bool keep =
          (n == 0 && (c == 0 || c == 2 || c == 69)) || (n == 1 && c < 64) || (n == 2 && c >= 64);
      want[size_t(n * C + c)] = keep ? x[size_t(n * C + c)] * 1.5f : 0.f;
    }
  std::vector<float> out(x.size(), -1.f);
  loom::cpu_backend().apply_bit_mask(out.data(), x.data(), bits.data(), N, C, 1.5f);
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * sizeof(float)));
  std::vector<float> in_place = x;
  loom::cpu_backend().apply_bit_mask(in_place.data(), in_place.data(), bits.data(), N, C, 1.5f);
  EXPECT_EQ(0, std::memcmp(in_place.data(), want.data(), want.size() * sizeof(float)));
}
