// Whole-model checks: parameter counts, gradients against finite differences for both
// families, recompute modes, packed sequences, determinism, and overfitting a fixed batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "model/model_test_util.h"
#include "optim/adamw.h"

using namespace loom;

namespace {

using test::Data;
using test::make_data;
using test::tiny;

void gradient_check(Family f) {
  Decoder m(tiny(f), cpu_backend());
  m.params().init(3);
  Data d = make_data({5, 7}, 32, 11);
  d.targets[2] = -1;  // an ignored position
  ParamSet& P = m.params();
  P.zero_grad();
  m.forward_backward(d.input(), 1.f);  // gradient of the summed loss
  std::vector<float> analytic(P.grad(), P.grad() + P.total());
  const float eps = 1e-2f;
  int checked = 0;
  for (const ParamInfo& p : P.infos()) {
    // A few elements of every tensor: spread evenly through it.
    for (int k = 0; k < 4; ++k) {
      int64_t i = p.offset + (p.numel - 1) * k / 3;
      float saved = P.data()[i];
      P.data()[i] = saved + eps;
      double lp = m.forward_loss(d.input());
      P.data()[i] = saved - eps;
      double lm = m.forward_loss(d.input());
      P.data()[i] = saved;
      double numeric = (lp - lm) / (2 * eps);
      double a = analytic[i];
      EXPECT_NEAR(a, numeric, 2e-2 * std::max(std::fabs(a), std::fabs(numeric)) + 2e-3)
          << p.name << " element " << (i - p.offset);
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

}  // namespace

TEST(Decoder, PresetParameterCounts) {
  EXPECT_EQ(model_preset("gpt2-124m").num_params(), 124475904);  // GPT-2 small, vocab 50304
  EXPECT_EQ(model_preset("llama-8b").num_params(), 8030261248);  // Llama 3 8B
  EXPECT_EQ(model_preset("llama-1b").num_params(), 1235814400);  // Llama 3.2 1B
  for (const auto& name : {"tiny", "tiny-llama"}) {
    Decoder m(model_preset(name), cpu_backend());
    int64_t n = 0;
    for (auto& p : m.params().infos()) n += p.numel;
    EXPECT_EQ(n, model_preset(name).num_params()) << name;
  }
  // 124M at seq 1024: 6N of the matmul weights plus attention.
  double f = model_preset("gpt2-124m").train_flops_per_token(1024);
  EXPECT_NEAR(f / 1e9, 0.7988, 0.01);
}

TEST(Decoder, ImpossibleShapesAreErrors) {
  ModelConfig c = tiny(Family::Llama);
  c.n_kv_head = 3;  // does not divide 4 heads
  EXPECT_THROW(Decoder(c, cpu_backend()), Error);
  c = tiny(Family::GPT2);
  c.n_head = 5;  // does not divide width 16
  EXPECT_THROW(c.validate(), Error);
  EXPECT_THROW(model_preset("gpt5"), Error);
}

// Llama 3.1's RoPE scaling reaches the model from its config keys: it changes the loss of
// sequences with positions (low frequencies rotate by less), not of position 0 alone, and the
// backward stays consistent with the forward.
TEST(Decoder, Llama3RopeScalingFromConfigChangesTheRotation) {
  Config cfg = Config::parse(
      "[model]\npreset = \"tiny-llama\"\nrope_scaling = \"llama3\"\nrope_factor = 8\n"
      "rope_original_max_seq = 4\n",
      "test.toml");
  ModelConfig scaled_cfg = model_config_from(cfg);
  EXPECT_EQ(scaled_cfg.rope_scaling, (RopeScaling{8.f, 1.f, 4.f, 4}));
  EXPECT_NE(scaled_cfg.fingerprint(), model_preset("tiny-llama").fingerprint());
  ModelConfig a_cfg = tiny(Family::Llama), b_cfg = a_cfg;
  b_cfg.rope_scaling = {8.f, 1.f, 4.f, 4};
  Decoder a(a_cfg, cpu_backend()), b(b_cfg, cpu_backend());
  a.params().init(5);
  std::memcpy(b.params().data(), a.params().data(), size_t(a.params().total()) * 4);
  Data d = make_data({9, 6}, 32, 3);
  EXPECT_NE(a.forward_loss(d.input()), b.forward_loss(d.input()));
  Data first = make_data({1, 1}, 32, 3);  // position 0 only: no rotation either way
  EXPECT_EQ(a.forward_loss(first.input()), b.forward_loss(first.input()));
  Config bad = Config::parse(
      "[model]\npreset = \"tiny-llama\"\nrope_scaling = \"llama3\"\n"
      "rope_low_freq_factor = 4\nrope_high_freq_factor = 1\n",
      "test.toml");
  EXPECT_THROW(model_config_from(bad), Error);
  Config yarn =
      Config::parse("[model]\npreset = \"tiny-llama\"\nrope_scaling = \"yarn\"\n", "test.toml");
  EXPECT_THROW(model_config_from(yarn), Error);
}

TEST(Decoder, GradientCheckGpt2) {
  gradient_check(Family::GPT2);
}
TEST(Decoder, GradientCheckLlama) {
  gradient_check(Family::Llama);
}

TEST(Decoder, RecomputeModesGiveIdenticalGradients) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    std::vector<float> ref;
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      Decoder m(tiny(f), cpu_backend(), r);
      m.params().init(5);
      m.params().zero_grad();
      Data d = make_data({9, 3, 4}, 32, 2);
      m.forward_backward(d.input(), 0.1f);
      std::vector<float> g(m.params().grad(), m.params().grad() + m.params().total());
      if (ref.empty())
        ref = g;
      else
        EXPECT_EQ(0, std::memcmp(ref.data(), g.data(), g.size() * 4)) << recompute_name(r);
    }
  }
}

TEST(Decoder, PackedDocumentsDoNotInteract) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(9);
    Data packed = make_data({6, 5}, 32, 4);
    double together = m.forward_loss(packed.input());
    // The same two documents run one at a time.
    Data a = packed, b = packed;
    a.tokens.resize(6), a.targets.resize(6), a.positions.resize(6), a.cu = {0, 6};
    b.tokens.erase(b.tokens.begin(), b.tokens.begin() + 6);
    b.targets.erase(b.targets.begin(), b.targets.begin() + 6);
    b.positions.erase(b.positions.begin(), b.positions.begin() + 6);
    b.cu = {0, 5};
    double apart = m.forward_loss(a.input()) + m.forward_loss(b.input());
    EXPECT_NEAR(together, apart, 1e-4 * std::fabs(apart));
  }
}

TEST(Decoder, SameSeedIsBitIdentical) {
  auto run = [] {
    Decoder m(tiny(Family::Llama), cpu_backend());
    m.params().init(1);
    m.params().zero_grad();
    Data d = make_data({16, 16}, 32, 3);
    double loss = m.forward_backward(d.input(), 1.f);
    std::vector<float> g(m.params().grad(), m.params().grad() + m.params().total());
    return std::make_pair(loss, g);
  };
  auto a = run(), b = run();
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(0, std::memcmp(a.second.data(), b.second.data(), a.second.size() * 4));
}

TEST(Decoder, GradientAccumulationEqualsOneLargeBatch) {
  // Two micro-batches accumulated with dloss = 1/total equal one batch holding both.
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(4);
  Data whole = make_data({8, 8, 8, 8}, 32, 6);
  ParamSet& P = m.params();
  P.zero_grad();
  double l1 = m.forward_backward(whole.input(), 1.f / 32);
  std::vector<float> g1(P.grad(), P.grad() + P.total());
  Data a = make_data({8, 8, 8, 8}, 32, 6), b = a;
  a.tokens.resize(16), a.targets.resize(16), a.positions.resize(16), a.cu = {0, 8, 16};
  b.tokens.erase(b.tokens.begin(), b.tokens.begin() + 16);
  b.targets.erase(b.targets.begin(), b.targets.begin() + 16);
  b.positions.erase(b.positions.begin(), b.positions.begin() + 16);
  b.cu = {0, 8, 16};
  P.zero_grad();
  double l2 = m.forward_backward(a.input(), 1.f / 32) + m.forward_backward(b.input(), 1.f / 32);
  EXPECT_NEAR(l1, l2, 1e-4 * std::fabs(l1));
  for (int64_t i = 0; i < P.total(); ++i)
    ASSERT_NEAR(g1[i], P.grad()[i], 1e-5f + 1e-4f * std::fabs(g1[i])) << i;
}

TEST(Decoder, TinyModelOverfitsAFixedBatch) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    ModelConfig c = tiny(f);
    c.init_std = 0.02f;
    Decoder m(c, cpu_backend());
    m.params().init(1);
    AdamWConfig ac;
    ac.weight_decay = 0;
    AdamW opt(m.params(), ac, DType::F32, cpu_backend());
    Data d = make_data({16, 16}, 32, 8);
    double first = 0, last = 0;
    for (int step = 0; step < 150; ++step) {
      m.params().zero_grad();
      double loss = m.forward_backward(d.input(), 1.f / 32) / 32;
      if (step == 0) first = loss;
      last = loss;
      opt.step(1e-2, 1.f);
    }
    EXPECT_NEAR(first, std::log(32.0), 0.3) << family_name(f);
    EXPECT_LT(last, 0.1) << family_name(f);
  }
}

TEST(Decoder, RejectsOutOfRangeTokens) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  Data d = make_data({4}, 32, 1);
  d.tokens[1] = 32;
  EXPECT_THROW(m.forward_loss(d.input()), Error);
  d = make_data({4}, 32, 1);
  d.positions[3] = 16;  // beyond max_seq
  EXPECT_THROW(m.forward_loss(d.input()), Error);
}
