// The FP8 / MXFP8 GEMM recipes (precision/fp8_recipes.h): GEMMs against the fp32 GEMM of the
// dequantised inputs (exactly, on inputs whose sums are exact in any order) and against the
// unquantised GEMM (a stated bound); delayed scaling's history and scales step by step against
// a hand reference; config validation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm_bf16.h"
#include "precision/fp8_recipes.h"

using namespace loom;
using cpu::Fp8Format;

namespace {

Fp8Options opts(Fp8RecipeKind k, bool hybrid = false) {
  Fp8Options o;
  o.kind = k;
  o.hybrid = hybrid;
  return o;
}

// C[M,N] = A[M,K] B^T (B: [N,K]), or A B when b_is_kn, in double.
std::vector<double> gemm_ref(const std::vector<float>& A, const std::vector<float>& B, int M, int N,
                             int K, bool b_is_kn) {
  std::vector<double> C(size_t(M) * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        s += double(A[size_t(i) * K + k]) *
             double(b_is_kn ? B[size_t(k) * N + j] : B[size_t(j) * K + k]);
      C[size_t(i) * N + j] = s;
    }
  return C;
}

std::vector<float> transpose(const std::vector<float>& x, int R, int C) {
  std::vector<float> t(x.size());
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) t[size_t(c) * R + r] = x[size_t(r) * C + c];
  return t;
}

// Random values with |v| in [lo, hi), random signs, some zeros.
std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = (g() % 11 == 0) ? 0.f : (g() & 1 ? -u(g) : u(g));
  return v;
}

// Per-tensor dequantisation, as the recipe defines it: decode(code of v * s) / s.
std::vector<float> deq_tensor(const std::vector<float>& v, float s, Fp8Format f) {
  std::vector<uint8_t> q(v.size());
  std::vector<float> d(v.size());
  cpu::fp8_quantize(f, v.data(), s, q.data(), int64_t(v.size()));
  cpu::fp8_dequantize(f, q.data(), 1.f / s, d.data(), int64_t(v.size()));
  return d;
}

std::vector<float> deq_mx(const std::vector<float>& v, int R, int C, bool along_rows, Fp8Format f) {
  std::vector<uint16_t> b(v.size());
  cpu::mx_quantize(f, v.data(), R, C, C, along_rows, nullptr, nullptr, b.data());
  std::vector<float> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = bf16_to_f32(b[i]);
  return d;
}

// Per-tensor current scaling on inputs whose fp8 codes are all multiples of 1/8 in [1, 8]
// except one 448 per tensor, placed so that no two 448s meet in a product: every product is a
// multiple of 2^-6 and every partial sum stays below 2^18, so the fp32 sums are exact in any
// order, and scales that are powers of two (amax = 448 / 2^k) make dequantisation exact. The
// recipe's GEMMs must then equal the GEMMs of the dequantised inputs bit for bit.
TEST(Fp8Recipe, TensorwiseGemmsEqualGemmsOfDequantisedInputsExactly) {
  const int N = 32, in = 48, out = 40;
  auto x = uniform(size_t(N) * in, 1 / 16.f, 8 / 16.f, 1);    // codes x*16 in [1, 8]
  auto w = uniform(size_t(out) * in, 1 / 64.f, 8 / 64.f, 2);  // codes w*64
  auto dy = uniform(size_t(N) * out, 1 / 4.f, 8 / 4.f, 3);    // codes dy*4 (scale 4)
  x[0] = 28.f;                                                // amax -> scale 448/28 = 16
  w[1] = -7.f;                                                // w[o=0, i=1]: scale 64
  dy[1] = 112.f;                                              // dy[n=0, o=1]: scale 4
  Fp8Linear r(opts(Fp8RecipeKind::TensorwiseCurrent), nullptr);
  std::vector<float> y(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in, 0.f);
  r.forward(cpu_backend(), y.data(), x.data(), w.data(), nullptr, N, in, out);
  r.backward(cpu_backend(), dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, in,
             out);
  EXPECT_EQ(r.scale(Fp8Linear::X), 16.f);
  EXPECT_EQ(r.scale(Fp8Linear::W), 64.f);
  EXPECT_EQ(r.scale(Fp8Linear::DY), 4.f);
  const auto xq = deq_tensor(x, 16.f, Fp8Format::E4M3), wq = deq_tensor(w, 64.f, Fp8Format::E4M3),
             dq = deq_tensor(dy, 4.f, Fp8Format::E4M3);
  ASSERT_NE(xq, x);  // the inputs really were rounded
  const auto ry = gemm_ref(xq, wq, N, out, in, false);
  const auto rdx = gemm_ref(dq, wq, N, in, out, true);
  const auto rdw = gemm_ref(transpose(dq, N, out), xq, out, in, N, true);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], float(ry[i])) << i;
  for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx[i], float(rdx[i])) << i;
  for (size_t i = 0; i < dw.size(); ++i) ASSERT_EQ(dw[i], float(rdw[i])) << i;
}

// MXFP8 on blocks whose amax lies in [1/4, 1/2): X = 2^-10, elements saturate above 448 (from
// 0.4375), dequantised values are multiples of 2^-7 below 1/2, so sums are exact again.
TEST(Fp8Recipe, MxGemmsEqualGemmsOfDequantisedInputsExactly) {
  const int N = 64, in = 96, out = 64;
  auto x = uniform(size_t(N) * in, 1 / 16.f, 1 / 2.f, 4);
  auto w = uniform(size_t(out) * in, 1 / 16.f, 1 / 2.f, 5);
  auto dy = uniform(size_t(N) * out, 1 / 16.f, 1 / 2.f, 6);
  for (std::vector<float>* v : {&x, &w, &dy})  // one block max per 32 elements, both directions
    for (size_t i = 0; i < v->size(); i += 7) (*v)[i] = 0.49f;
  for (bool hybrid : {false, true}) {
    const Fp8Format bf = hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3;
    Fp8Linear r(opts(Fp8RecipeKind::Mxfp8, hybrid), nullptr);
    std::vector<float> y(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in, 0.f);
    r.forward(cpu_backend(), y.data(), x.data(), w.data(), nullptr, N, in, out);
    r.backward(cpu_backend(), dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, in,
               out);
    const auto ry = gemm_ref(deq_mx(x, N, in, false, Fp8Format::E4M3),
                             deq_mx(w, out, in, false, Fp8Format::E4M3), N, out, in, false);
    const auto rdx = gemm_ref(deq_mx(dy, N, out, false, bf),
                              deq_mx(w, out, in, true, Fp8Format::E4M3), N, in, out, true);
    const auto rdw = gemm_ref(transpose(deq_mx(dy, N, out, true, bf), N, out),
                              deq_mx(x, N, in, true, Fp8Format::E4M3), out, in, N, true);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], float(ry[i])) << i;
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx[i], float(rdx[i])) << i;
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_EQ(dw[i], float(rdw[i])) << i;
  }
}

// On general inputs (normal values over several binades) every recipe is within a stated bound
// of the unquantised GEMM: each E4M3 value is within 2^-4 relative of its input (3 mantissa
// bits, round to nearest) when it is a normal fp8 value, so a product is within
// 2 * 2^-4 + 2^-8 relative; we allow 0.14 * sum |x||w| per output (E5M2 dy: 2^-3 relative,
// 0.21), plus fp8 subnormal losses, which the scales keep below that for these inputs. Measured
// relative Frobenius errors are ~3% (E4M3) and must stay under 6%.
TEST(Fp8Recipe, EveryRecipeIsWithinABoundOfTheUnquantisedGemm) {
  const int N = 40, in = 80, out = 72;
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(N) * in), w(size_t(out) * in), dy(size_t(N) * out),
      b(static_cast<size_t>(out));
  for (float& v : x) v = nd(g) * 3.f;
  for (float& v : w) v = nd(g) * 0.02f;
  for (float& v : dy) v = nd(g) * 1e-4f;
  for (float& v : b) v = nd(g);
  const auto ry = gemm_ref(x, w, N, out, in, false);
  const auto rdx = gemm_ref(dy, w, N, in, out, true);
  const auto rdw = gemm_ref(transpose(dy, N, out), x, out, in, N, true);
  const auto ay = gemm_ref(std::vector<float>(x.begin(), x.end()), w, N, out, in, false);
  auto absum = [](std::vector<float> a) {
    for (float& v : a) v = std::fabs(v);
    return a;
  };
  const auto sy = gemm_ref(absum(x), absum(w), N, out, in, false);
  const auto sdx = gemm_ref(absum(dy), absum(w), N, in, out, true);
  const auto sdw = gemm_ref(transpose(absum(dy), N, out), absum(x), out, in, N, true);
  for (Fp8RecipeKind k :
       {Fp8RecipeKind::TensorwiseCurrent, Fp8RecipeKind::TensorwiseDelayed, Fp8RecipeKind::Mxfp8})
    for (bool hybrid : {false, true}) {
      Fp8Linear r(opts(k, hybrid), nullptr);
      std::vector<float> y(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in, 0.f),
          db(static_cast<size_t>(out), 0.f);
      // Delayed scaling: a first step records the amaxes, the second uses them.
      for (int step = 0; step < (k == Fp8RecipeKind::TensorwiseDelayed ? 2 : 1); ++step) {
        std::fill(dw.begin(), dw.end(), 0.f);
        std::fill(db.begin(), db.end(), 0.f);
        r.roll_history();
        r.new_weights();
        r.forward(cpu_backend(), y.data(), x.data(), w.data(), b.data(), N, in, out);
        r.backward(cpu_backend(), dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N,
                   in, out);
      }
      const double tol_b = hybrid ? 0.21 : 0.14;
      double e2 = 0, r2 = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        const double ref = ry[i] + b[i % size_t(out)];
        ASSERT_LE(std::fabs(y[i] - ref), 0.14 * sy[i] + 1e-6) << fp8_recipe_name(k) << " y " << i;
        e2 += (y[i] - ref) * (y[i] - ref), r2 += ay[i] * ay[i];
      }
      EXPECT_LT(std::sqrt(e2 / r2), 0.06) << fp8_recipe_name(k);
      for (size_t i = 0; i < dx.size(); ++i)
        ASSERT_LE(std::fabs(dx[i] - rdx[i]), tol_b * sdx[i] + 1e-12) << fp8_recipe_name(k) << i;
      for (size_t i = 0; i < dw.size(); ++i)
        ASSERT_LE(std::fabs(dw[i] - rdw[i]), tol_b * sdw[i] + 1e-12) << fp8_recipe_name(k) << i;
      for (int o = 0; o < out; ++o) {  // the bias gradient is the fp32 column sum of dy
        double s = 0;
        for (int n = 0; n < N; ++n) s += dy[size_t(n) * out + o];
        EXPECT_NEAR(db[size_t(o)], s, 1e-9);
      }
    }
}

// The per-tensor recipes' scales change every call (current) or every step (delayed); the GEMMs
// apply them after oneDNN's kernel (gemm_bf16_varying_alpha), so after the first step no oneDNN
// primitive is created: a primitive per scale would be a JIT compilation per GEMM. The shapes
// take the weight gradient's blocks (512 rows) as gpt2's layers do.
TEST(Fp8Recipe, PerTensorRecipesCreateNoGemmPrimitivesAfterTheFirstStep) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn)
    GTEST_SKIP() << "no oneDNN primitives: " << cpu::bf16_gemm_path_name();
  const int N = 64, in = 96, out = 512;
  for (Fp8RecipeKind k : {Fp8RecipeKind::TensorwiseCurrent, Fp8RecipeKind::TensorwiseDelayed}) {
    Fp8Linear r(opts(k), nullptr);
    std::vector<float> y(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in, 0.f),
        b(size_t(out), 0.5f);
    uint64_t after_first = 0;
    for (int step = 0; step < 4; ++step) {
      // New amaxes every step: new scales.
      auto x = uniform(size_t(N) * in, 0.1f, 1.f + float(step), uint32_t(10 + step));
      auto w = uniform(size_t(out) * in, 0.01f, 0.1f * float(step + 1), uint32_t(20 + step));
      auto dy = uniform(size_t(N) * out, 1e-3f, 1e-2f / float(step + 1), uint32_t(30 + step));
      r.roll_history();
      r.new_weights();
      r.forward(cpu_backend(), y.data(), x.data(), w.data(), b.data(), N, in, out);
      r.backward(cpu_backend(), dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, in,
                 out);
      if (step == 0) after_first = cpu::bf16_gemm_primitives_created();
    }
    EXPECT_EQ(cpu::bf16_gemm_primitives_created(), after_first) << fp8_recipe_name(k);
  }
}

// The per-tensor recipes keep x as the training forward quantised it for that forward's wgrad.
// Two layers sharing one scratch run forward, forward, backward, backward (a model's order):
// each layer's dW and dx equal those of a fresh layer whose backward quantises x itself, bit
// for bit; and an evaluation forward keeps nothing (its backward quantises x again).
TEST(Fp8Recipe, WgradFromTheForwardsQuantisedInputEqualsAFreshQuantisation) {
  const int N = 48, in = 64, out = 80;
  for (Fp8RecipeKind k : {Fp8RecipeKind::TensorwiseCurrent, Fp8RecipeKind::TensorwiseDelayed}) {
    Fp8Linear::Scratch shared;
    Fp8Linear l1(opts(k), nullptr), l2(opts(k), nullptr);
    l1.share_scratch(&shared);
    l2.share_scratch(&shared);
    auto x1 = uniform(size_t(N) * in, 0.1f, 3.f, 40), x2 = uniform(size_t(N) * in, 0.1f, 5.f, 41);
    auto w = uniform(size_t(out) * in, 0.01f, 0.2f, 42);
    auto dy = uniform(size_t(N) * out, 1e-3f, 1e-2f, 43);
    std::vector<float> y(size_t(N) * out), dx1(size_t(N) * in), dx2(dx1), dw1(w.size(), 0.f),
        dw2(w.size(), 0.f);
    l1.forward(cpu_backend(), y.data(), x1.data(), w.data(), nullptr, N, in, out);
    l2.forward(cpu_backend(), y.data(), x2.data(), w.data(), nullptr, N, in, out);
    l2.backward(cpu_backend(), dx2.data(), dw2.data(), nullptr, dy.data(), x2.data(), w.data(), N,
                in, out);
    l1.backward(cpu_backend(), dx1.data(), dw1.data(), nullptr, dy.data(), x1.data(), w.data(), N,
                in, out);
    for (int eval = 0; eval < 2; ++eval)
      for (int layer = 0; layer < 2; ++layer) {
        std::vector<float> x = layer == 0 ? x1 : x2;
        Fp8Linear fresh(opts(k), nullptr);
        if (eval == 1) {  // an evaluation forward on other values in the same buffer first
          const std::vector<float> x_eval = uniform(x.size(), 0.1f, 9.f, 44);
          std::copy(x_eval.begin(), x_eval.end(), x.begin());
          fresh.set_recording(false);
          fresh.forward(cpu_backend(), y.data(), x.data(), w.data(), nullptr, N, in, out);
          fresh.set_recording(true);
          x = layer == 0 ? x1 : x2;  // (assigned in place: the same buffer)
        }
        std::vector<float> dx(dx1.size()), dw(w.size(), 0.f);
        fresh.backward(cpu_backend(), dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(),
                       N, in, out);
        EXPECT_EQ(dw, layer == 0 ? dw1 : dw2) << fp8_recipe_name(k) << " layer " << layer;
        EXPECT_EQ(dx, layer == 0 ? dx1 : dx2) << fp8_recipe_name(k) << " layer " << layer;
      }
  }
}

// Delayed scaling against a hand reference: history length 3, margin 1, amax = max of the
// history (then most_recent). Step t's GEMMs use the scale from steps < t; this step's amax
// joins the history at the next roll. E4M3: scale = 448 / amax / 2.
TEST(Fp8Recipe, DelayedScalingHistoryStepByStep) {
  const int N = 2, in = 4, out = 2;
  const float amaxes[] = {2.f, 8.f, 1.f, 0.5f, 0.25f};
  for (bool most_recent : {false, true}) {
    Fp8Options o = opts(Fp8RecipeKind::TensorwiseDelayed);
    o.amax_history = 3;
    o.margin = 1;
    o.most_recent = most_recent;
    Fp8Linear r(o, nullptr);
    std::vector<float> w(size_t(out) * in, 0.25f), y(size_t(N) * out);
    float expect_scale = 1.f;  // before any history: TE's initial scale
    std::vector<float> hist;
    for (int t = 0; t < 5; ++t) {
      r.roll_history();
      if (t > 0) {  // step t-1's amax joined the history: the reference update
        hist.push_back(amaxes[t - 1]);
        if (hist.size() > 3) hist.erase(hist.begin());
        const float a = most_recent ? hist.back() : *std::max_element(hist.begin(), hist.end());
        expect_scale = 448.f / a / 2.f;
      }
      EXPECT_EQ(r.history(Fp8Linear::X), hist) << "step " << t;
      EXPECT_EQ(r.scale(Fp8Linear::X), expect_scale)
          << "step " << t << " most_recent " << most_recent;
      std::vector<float> x(size_t(N) * in, 0.f);
      x[3] = -amaxes[t];  // this step's amax of x
      r.new_weights();
      r.forward(cpu_backend(), y.data(), x.data(), w.data(), nullptr, N, in, out);
      EXPECT_EQ(r.pending_amax(Fp8Linear::X), amaxes[t]);
      // The GEMM used the scale of earlier steps: y[0] = fp8(x*s)/s * fp8(w*sw)/sw summed.
      const float sw = r.scale(Fp8Linear::W);
      const float xq = cpu::fp8_round(Fp8Format::E4M3, -amaxes[t] * expect_scale) / expect_scale;
      const float wq = cpu::fp8_round(Fp8Format::E4M3, 0.25f * sw) / sw;
      EXPECT_FLOAT_EQ(y[0], xq * wq) << "step " << t;
    }
  }
  // Zero and non-finite amaxes: the scale stays (TE updates only from a positive finite amax).
  Fp8Options o = opts(Fp8RecipeKind::TensorwiseDelayed);
  o.amax_history = 1;
  Fp8Linear r(o, nullptr);
  std::vector<float> w(8, 0.f), x(8, 4.f), y(4);
  r.forward(cpu_backend(), y.data(), x.data(), w.data(), nullptr, 2, 4, 2);
  r.roll_history();
  EXPECT_EQ(r.scale(Fp8Linear::X), 112.f);
  EXPECT_EQ(r.scale(Fp8Linear::W), 1.f);  // amax 0
  x[2] = NAN;
  r.forward(cpu_backend(), y.data(), x.data(), w.data(), nullptr, 2, 4, 2);
  r.roll_history();
  EXPECT_EQ(r.scale(Fp8Linear::X), 112.f);
}

// Current scaling: the scale is fmt_max / amax / 2^margin of the tensor at hand, E5M2's 57344
// for dy under hybrid.
TEST(Fp8Recipe, CurrentScalingUsesTheAmaxNow) {
  Fp8Options o = opts(Fp8RecipeKind::TensorwiseCurrent, true);
  o.margin = 2;
  Fp8Linear r(o, nullptr);
  std::vector<float> x(8, 1.f), w(8, 0.5f), y(4), dy(4, -3.f), dx(8);
  x[5] = -7.f;
  r.forward(cpu_backend(), y.data(), x.data(), w.data(), nullptr, 2, 4, 2);
  EXPECT_EQ(r.scale(Fp8Linear::X), 448.f / 7.f / 4.f);
  EXPECT_EQ(r.scale(Fp8Linear::W), 448.f / 0.5f / 4.f);
  r.backward(cpu_backend(), dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), 2, 4, 2);
  EXPECT_EQ(r.scale(Fp8Linear::DY), 57344.f / 3.f / 4.f);
  EXPECT_EQ(r.format(Fp8Linear::DY), Fp8Format::E5M2);
}

void expect_config_error(const std::string& toml, const std::string& needle) {
  Config c = Config::parse(toml, "run.toml");
  Fp8Options o;
  try {
    Fp8Options::from(c, 4, &o);
    ADD_FAILURE() << "accepted: " << toml;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Fp8RecipeBadInput, ConfigErrorsNameTheKey) {
  expect_config_error("[precision]\nfp8_recipe = \"fp9\"\n", "unknown recipe 'fp9'");
  expect_config_error("[precision]\nfp8_recipe = \"mxfp8\"\nfp8_format = \"e5m2\"\n",
                      "precision.fp8_format");
  expect_config_error("[precision]\nfp8_recipe = \"fp8_tensorwise_current\"\nfp8_margin = -1\n",
                      "precision.fp8_margin");
  expect_config_error(
      "[precision]\nfp8_recipe = \"fp8_tensorwise_delayed\"\nfp8_amax_history = 0\n",
      "precision.fp8_amax_history");
  expect_config_error(
      "[precision]\nfp8_recipe = \"fp8_tensorwise_delayed\"\nfp8_amax_compute = \"mean\"\n",
      "precision.fp8_amax_compute");
  expect_config_error(
      "[precision]\nfp8_recipe = \"fp8_tensorwise_current\"\nfp8_amax_history = 4\n",
      "fp8_tensorwise_delayed only");
  expect_config_error("[precision]\nfp8_recipe = \"mxfp8\"\nfp8_margin = 1\n", "no margin");
  expect_config_error("[precision]\nfp8_format = \"hybrid\"\n", "precision.fp8_recipe is not");
  expect_config_error(
      "[precision]\nfp8_recipe = \"mxfp8\"\nfp8_keep_first = 2\nfp8_keep_last = 2\n",
      "keep all 4 blocks");
  expect_config_error("[precision]\nfp8_recipe = \"mxfp8\"\nfp8_keep_last = 5\n",
                      "precision.fp8_keep_last");
}

TEST(Fp8RecipeBadInput, GoodConfigIsRead) {
  Config c = Config::parse(
      "[precision]\nfp8_recipe = \"fp8_tensorwise_delayed\"\nfp8_format = \"hybrid\"\n"
      "fp8_margin = 2\nfp8_amax_history = 16\nfp8_amax_compute = \"most_recent\"\n"
      "fp8_keep_first = 1\nfp8_keep_last = 1\n",
      "run.toml");
  Fp8Options o;
  ASSERT_TRUE(Fp8Options::from(c, 4, &o));
  EXPECT_EQ(o.kind, Fp8RecipeKind::TensorwiseDelayed);
  EXPECT_TRUE(o.hybrid);
  EXPECT_EQ(o.margin, 2);
  EXPECT_EQ(o.amax_history, 16);
  EXPECT_TRUE(o.most_recent);
  EXPECT_EQ(o.keep_first, 1);
  EXPECT_EQ(o.keep_last, 1);
  EXPECT_FALSE(Fp8Options::from(Config::parse("", "empty.toml"), 4, &o));
}

}  // namespace
