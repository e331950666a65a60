// The bf16 policy's GEMMs in bf16 (precision/bf16_gemms.h): the same model as fp32 GEMMs on the
// same bf16 values up to summation order (stated tolerances), weights converted once per step
// and again after new_weights(), and a training curve that tracks fp32's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/gemm_bf16.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "precision/bf16_gemms.h"
#include "small_bf16_models.h"

using namespace loom;

namespace {

using test::small_batch;
using test::small_bf16_model;
using Data = test::SmallBatch;

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i)
    ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb);
}

}  // namespace

TEST(Bf16Gemms, SameModelAsFp32GemmsOnBf16Values) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder a(small_bf16_model(f), cpu_backend(), Recompute::None, DType::BF16);
    Decoder b(small_bf16_model(f), cpu_backend(), Recompute::None, DType::BF16);
    a.params().init(3);
    round_to(DType::BF16, a.params().data(), size_t(a.params().total()));
    std::copy(a.params().data(), a.params().data() + a.params().total(), b.params().data());
    auto recipe = attach_bf16_gemms(b, true);
    ASSERT_NE(recipe, nullptr);
    Data d = small_batch(4, 32, 5);
    a.params().zero_grad();
    b.params().zero_grad();
    const double la = a.forward_backward(d.input(), 1.f / 128),
                 lb = b.forward_backward(d.input(), 1.f / 128);
    EXPECT_NEAR(lb, la, 2e-3 * std::fabs(la)) << family_name(f);
    EXPECT_GT(cosine(a.params().grad(), b.params().grad(), a.params().total()), 0.999)
        << family_name(f);
    // Every linear layer's weight converted once, in forward, reused by backward.
    EXPECT_EQ(recipe->weight_conversions(), int64_t(b.linears().size()));
  }
}

TEST(Bf16Gemms, NewWeightsAreConvertedAgain) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  Decoder m(small_bf16_model(Family::Llama), cpu_backend(), Recompute::None, DType::BF16);
  m.params().init(7);
  round_to(DType::BF16, m.params().data(), size_t(m.params().total()));
  auto recipe = attach_bf16_gemms(m, true);
  Data d = small_batch(2, 16, 3);
  const double before = m.forward_loss(d.input());
  for (int64_t i = 0; i < m.params().total(); ++i) m.params().data()[i] *= 0.5f;  // exact in bf16
  recipe->new_weights();
  const double after = m.forward_loss(d.input());
  Decoder fresh(small_bf16_model(Family::Llama), cpu_backend(), Recompute::None, DType::BF16);
  std::copy(m.params().data(), m.params().data() + m.params().total(), fresh.params().data());
  auto r2 = attach_bf16_gemms(fresh, true);
  EXPECT_EQ(after, fresh.forward_loss(d.input()));
  EXPECT_NE(before, after);
}

// Training: 40 AdamW steps on a fixed batch, bf16 with bf16 GEMMs against fp32: the loss curves
// stay within 5% of each other (bf16 rounds weights and activations; measured gap here < 1%).
TEST(Bf16Gemms, TrainingTracksFp32) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  std::vector<double> curve[2];
  for (int k = 0; k < 2; ++k) {
    const DType t = k == 0 ? DType::F32 : DType::BF16;
    ModelConfig c = small_bf16_model(Family::GPT2);
    c.init_std = 0.02f;
    Decoder m(c, cpu_backend(), Recompute::None, t);
    m.params().init(1);
    if (t == DType::BF16) round_to(t, m.params().data(), size_t(m.params().total()));
    AdamWConfig ac;
    AdamW opt(m.params(), ac, t, cpu_backend());
    auto recipe = t == DType::BF16 ? attach_bf16_gemms(m, true) : nullptr;
    Data d = small_batch(4, 32, 9);
    for (int s = 0; s < 40; ++s) {
      if (recipe) recipe->new_weights();
      m.params().zero_grad();
      curve[k].push_back(m.forward_backward(d.input(), 1.f / 128) / 128);
      opt.step(3e-3, 1.f);
    }
  }
  for (size_t s = 0; s < curve[0].size(); ++s)
    EXPECT_NEAR(curve[1][s], curve[0][s], 0.05 * curve[0][s]) << "step " << s;
  EXPECT_LT(curve[1].back(), 0.7 * curve[1].front());
}

// The optimizer writes the weights' bf16 copy in its own pass (AdamW::update): after a step,
// new_weights() finds every weight current and nothing is converted again; the GEMMs then read
// exactly what a fresh conversion of the stepped weights gives (a second model, same weights,
// converting them itself: the same loss and gradients, bit for bit).
TEST(Bf16Gemms, OptimizerWrittenWeightsNeedNoConversion) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  Decoder m(small_bf16_model(Family::GPT2), cpu_backend(), Recompute::None, DType::BF16);
  m.params().init(4);
  round_to(DType::BF16, m.params().data(), size_t(m.params().total()));
  AdamW opt(m.params(), AdamWConfig{}, DType::BF16, cpu_backend());
  auto recipe = attach_bf16_gemms(m, true);
  ASSERT_NE(m.params().bf16_data(), nullptr);
  Data d = small_batch(2, 16, 8);
  for (int s = 0; s < 3; ++s) {
    recipe->new_weights();
    m.params().zero_grad();
    m.forward_backward(d.input(), 1.f / 32);
    opt.step(1e-2, 1.f);
  }
  // Converted once, on first use, before the optimizer had written anything.
  EXPECT_EQ(recipe->weight_conversions(), int64_t(m.linears().size()));
  recipe->new_weights();
  m.params().zero_grad();
  const double loss = m.forward_backward(d.input(), 1.f / 32);
  EXPECT_EQ(recipe->weight_conversions(), int64_t(m.linears().size()));

  Decoder fresh(small_bf16_model(Family::GPT2), cpu_backend(), Recompute::None, DType::BF16);
  std::copy(m.params().data(), m.params().data() + m.params().total(), fresh.params().data());
  auto r2 = attach_bf16_gemms(fresh, true);
  fresh.params().zero_grad();
  EXPECT_EQ(loss, fresh.forward_backward(d.input(), 1.f / 32));
  EXPECT_EQ(r2->weight_conversions(), int64_t(fresh.linears().size()));
  EXPECT_EQ(0, std::memcmp(m.params().grad(), fresh.params().grad(),
                           sizeof(float) * size_t(m.params().total())));
  // Weights written by hand (not by the optimizer) are converted again.
  for (int64_t i = 0; i < m.params().total(); ++i) m.params().data()[i] *= 0.5f;
  recipe->new_weights();
  m.forward_loss(d.input());
  EXPECT_EQ(recipe->weight_conversions(), 2 * int64_t(m.linears().size()));
}

// The first weight-gradient GEMM into a linear's dW after ParamSet::zero_grad() overwrites it
// (no read of dW) instead of accumulating onto the zeros; later ones accumulate. Garbage (NaN)
// written into the linears' gradients after zero_grad() must vanish, the result must equal
// accumulating onto zeros bit for bit, and a second micro-batch must add to the first.
TEST(Bf16Gemms, FirstWeightGradientAfterZeroGradOverwrites) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(small_bf16_model(f), cpu_backend(), Recompute::None, DType::BF16);
    m.params().init(6);
    round_to(DType::BF16, m.params().data(), size_t(m.params().total()));
    auto recipe = attach_bf16_gemms(m, true);
    ASSERT_NE(recipe, nullptr);
    ParamSet& P = m.params();
    const int64_t n = P.total();
    std::vector<const ParamInfo*> weights;  // the linears' weight matrices
    for (const auto& l : m.linears()) {
      const std::string w =
          l.name == "head" && !P.has("head.weight") ? "embed.wte" : l.name + ".weight";
      weights.push_back(&P.info(w));
    }
    Data d1 = small_batch(2, 32, 11), d2 = small_batch(2, 32, 12);

    P.zero_grad();
    for (const ParamInfo* w : weights)
      std::fill(P.grad() + w->offset, P.grad() + w->offset + w->numel, std::nanf(""));
    m.forward_backward(d1.input(), 1.f / 64);
    const std::vector<float> g1(P.grad(), P.grad() + n);
    for (const ParamInfo* w : weights)
      for (int64_t i = 0; i < w->numel; ++i)
        ASSERT_TRUE(std::isfinite(g1[size_t(w->offset + i)])) << w->name << "[" << i << "]";

    // Zeroed by hand, not by zero_grad(): the recipe accumulates onto the zeros.
    std::fill(P.grad(), P.grad() + n, 0.f);
    m.forward_backward(d1.input(), 1.f / 64);
    EXPECT_EQ(0, std::memcmp(g1.data(), P.grad(), sizeof(float) * size_t(n))) << family_name(f);

    P.zero_grad();
    m.forward_backward(d2.input(), 1.f / 64);
    const std::vector<float> g2(P.grad(), P.grad() + n);
    P.zero_grad();
    m.forward_backward(d1.input(), 1.f / 64);
    m.forward_backward(d2.input(), 1.f / 64);  // a second micro-batch of the same step
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      worst = std::max(worst, double(std::fabs(P.grad()[i] - (g1[size_t(i)] + g2[size_t(i)]))));
      scale = std::max(scale, double(std::fabs(g1[size_t(i)] + g2[size_t(i)])));
    }
    EXPECT_LE(worst, 1e-6 * scale) << family_name(f);
    EXPECT_GT(scale, 0.0);
  }
}

// The output head's input gradient keeps its weight packed between the chunks of a step
// (cpu::gemm_bf16_reused_b): every call gives the plain GEMM's bits, also after the weights
// changed through the optimizer's writes into the bf16 copy (no new_weights() in between) or
// through fp32 values and new_weights() (a load). A packed copy kept across either change
// would give the old weights' product.
TEST(Bf16Gemms, HeadInputGradientFollowsEveryWeightChange) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  const int V = 1 << 18, C = 64, N = 8;  // 16M weights: the recipe's reuse threshold
  ParamSet P;
  P.add("head.weight", {V, C}, true, ParamInit::Normal, 0.02f);
  P.allocate();
  P.init(3);
  round_to(DType::BF16, P.data(), size_t(P.total()));
  Bf16Gemms recipe(&P);
  std::vector<float> dy(size_t(N) * V);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = bf16_to_f32(f32_to_bf16(normal_at(4, 1, i)));
  std::vector<uint16_t> dy16(dy.size()), x16(size_t(N) * C, 0);
  for (size_t i = 0; i < dy.size(); ++i) dy16[i] = f32_to_bf16(dy[i]);
  const float* w = P.data();
  auto check = [&](const char* when) {
    std::vector<uint16_t> w16(size_t(P.total()));
    for (size_t i = 0; i < w16.size(); ++i) w16[i] = f32_to_bf16(w[i]);
    std::vector<float> plain(size_t(N) * C), want(size_t(N) * C), got(size_t(N) * C);
    cpu::gemm_bf16(false, false, N, C, V, 1.f, dy16.data(), V, w16.data(), C, 0.f, plain.data(), C);
    // Each call is compared with a recipe that has never seen a weight, and the first with the
    // plain GEMM too: with AMX the packed layout's kernel may sum in another order than the
    // plain GEMM's, so a packed call can differ from the plain GEMM; a stale copy differs from
    // both.
    Bf16Gemms fresh;
    for (int call = 0; call < 3; ++call) {  // plain, packing, packed
      std::fill(got.begin(), got.end(), std::nanf(""));
      std::fill(want.begin(), want.end(), std::nanf(""));
      recipe.backward(cpu_backend(), got.data(), nullptr, nullptr, dy.data(), ActIn(x16.data()), w,
                      N, C, V);
      fresh.backward(cpu_backend(), want.data(), nullptr, nullptr, dy.data(), ActIn(x16.data()), w,
                     N, C, V);
      if (call == 0) {
        ASSERT_EQ(0, std::memcmp(plain.data(), got.data(), sizeof(float) * got.size())) << when;
      }
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), sizeof(float) * want.size()))
          << when << ", call " << call;
    }
  };
  check("first weights");
  // As AdamW::update writes: the fp32 values and their bf16 bits, the range noted.
  for (int64_t i = 0; i < P.total(); ++i) {
    P.data()[i] = bf16_to_f32(f32_to_bf16(P.data()[i] * -0.75f + 1e-3f));
    P.bf16_data()[i] = f32_to_bf16(P.data()[i]);
  }
  P.note_bf16_written(0, P.total());
  check("after the optimizer's write");
  recipe.new_weights();  // as the trainer does after each step: the written ranges are taken
  // As a load writes: fp32 values only, then new_weights().
  for (int64_t i = 0; i < P.total(); ++i) P.data()[i] = bf16_to_f32(f32_to_bf16(P.data()[i] * 2));
  recipe.new_weights();
  check("after fp32 values and new_weights()");
}

// GemmRecipe::dy_bits: the bits a caller leaves while rounding dy are what backward() reads for
// that dy, and only for that dy and only up to the recipe's next call (a note left for another
// pointer or size, or before a forward, is ignored: dy is converted as without a note).
TEST(Bf16Gemms, NotedGradientBitsAreUsedOnlyForTheirDy) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  const int N = 24, in = 40, out = 56;
  std::vector<float> w(size_t(out) * in), x(size_t(N) * in), dy(size_t(N) * out);
  for (size_t i = 0; i < w.size(); ++i) w[i] = round_bf16(uniform_at(7, 1, i) - 0.5f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = round_bf16(uniform_at(7, 2, i) - 0.5f);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = uniform_at(7, 3, i) - 0.5f;  // not yet rounded
  std::vector<float> y(size_t(N) * out);
  struct Result {
    std::vector<float> dx, dw;
  };
  // One backward on a fresh recipe; `note` runs between the forward and the backward.
  auto run = [&](auto note) {
    Bf16Gemms r;
    std::vector<float> d = dy;
    Result res{std::vector<float>(x.size()), std::vector<float>(w.size(), 0.f)};
    r.forward(cpu_backend(), y.data(), ActIn(x.data()), w.data(), nullptr, N, in, out);
    note(r, d);
    r.backward(cpu_backend(), res.dx.data(), res.dw.data(), nullptr, d.data(), ActIn(x.data()),
               w.data(), N, in, out);
    return res;
  };
  const int64_t n = int64_t(N) * out;
  auto same = [](const Result& a, const Result& b) { return a.dx == b.dx && a.dw == b.dw; };
  const Result plain = run([&](Bf16Gemms&, std::vector<float>& d) {
    cpu::round_bf16_array(d.data(), nullptr, d.size());
  });
  // Rounded with the bits stored in the same pass: the same products.
  EXPECT_TRUE(same(plain, run([&](Bf16Gemms& r, std::vector<float>& d) {
                     cpu::round_bf16_array(d.data(), r.dy_bits(d.data(), n), d.size());
                   })));
  // Wrong bits noted for dy are read (so the checks below could fail)...
  auto wrong = [&](Bf16Gemms& r, const float* key, int64_t len) {
    uint16_t* b = r.dy_bits(key, len);
    std::fill(b, b + len, uint16_t{0x3f80});  // 1.0 everywhere
  };
  EXPECT_FALSE(same(plain, run([&](Bf16Gemms& r, std::vector<float>& d) {
                      cpu::round_bf16_array(d.data(), nullptr, d.size());
                      wrong(r, d.data(), n);
                    })));
  // ...but not when noted for another pointer, another size, or before a forward.
  std::vector<float> other(dy.size());
  EXPECT_TRUE(same(plain, run([&](Bf16Gemms& r, std::vector<float>& d) {
                     cpu::round_bf16_array(d.data(), nullptr, d.size());
                     wrong(r, other.data(), n);
                   })));
  EXPECT_TRUE(same(plain, run([&](Bf16Gemms& r, std::vector<float>& d) {
                     cpu::round_bf16_array(d.data(), nullptr, d.size());
                     wrong(r, d.data(), n - 1);
                   })));
  EXPECT_TRUE(same(plain, run([&](Bf16Gemms& r, std::vector<float>& d) {
                     cpu::round_bf16_array(d.data(), nullptr, d.size());
                     wrong(r, d.data(), n);
                     std::vector<float> y2(y.size());
                     r.forward(cpu_backend(), y2.data(), ActIn(x.data()), w.data(), nullptr, N, in,
                               out);
                   })));
}
