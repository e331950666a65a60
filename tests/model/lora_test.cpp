// LoRA adapters: a fresh adapter (B = 0) leaves the model unchanged, gradients of A and B match
// finite differences, the merged model equals base + adapters, the base stays frozen, targets.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "model/model_test_util.h"

using namespace loom;

namespace {

using test::Data;
using test::tiny;

Data make_data(const std::vector<int>& lens, uint64_t seed) {
  return test::make_data(lens, 32, seed);
}

LoraConfig cfg(int r, std::vector<std::string> targets = {"all-linear"}) {
  LoraConfig c;
  c.rank = r;
  c.alpha = 2 * r;
  c.targets = std::move(targets);
  c.seed = 5;
  return c;
}

void randomise_b(Lora& lora) {
  ParamSet& P = lora.params();
  for (const ParamInfo& p : P.infos())
    if (p.name.find("lora_B") != std::string::npos)
      for (int64_t i = 0; i < p.numel; ++i)
        P.data()[p.offset + i] = 0.3f * (uniform_at(9, 9, uint64_t(p.offset + i)) - 0.5f);
}

}  // namespace

TEST(Lora, FreshAdaptersLeaveTheModelUnchangedAndFreezeTheBase) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(3);
    Data d = make_data({7, 6}, 4);
    const double base = m.forward_loss(d.input());
    Lora lora(m, cfg(4));
    EXPECT_EQ(lora.target_names().size(), 8u);  // 4 linear layers x 2 blocks, not the head
    EXPECT_EQ(m.forward_loss(d.input()), base) << family_name(f);
    m.params().zero_grad();
    lora.params().zero_grad();
    m.forward_backward(d.input(), 1.f);
    for (int64_t i = 0; i < m.params().total(); ++i) ASSERT_EQ(m.params().grad()[i], 0.f);
    double gb = 0;
    for (const ParamInfo& p : lora.params().infos())
      if (p.name.find("lora_B") != std::string::npos)
        for (int64_t i = 0; i < p.numel; ++i) gb += std::fabs(lora.params().grad()[p.offset + i]);
    EXPECT_GT(gb, 0.0);  // B learns first (A's gradient is 0 while B is 0)
  }
}

TEST(Lora, GradientsOfAAndBMatchFiniteDifferences) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(7);
    Lora lora(m, cfg(3));
    randomise_b(lora);
    Data d = make_data({6, 5}, 8);
    ParamSet& P = lora.params();
    P.zero_grad();
    m.forward_backward(d.input(), 1.f);
    const std::vector<float> g(P.grad(), P.grad() + P.total());
    const float eps = 1e-2f;
    int checked = 0;
    for (const ParamInfo& p : P.infos())
      for (int k = 0; k < 3; ++k) {
        const int64_t i = p.offset + (p.numel - 1) * k / 2;
        const float saved = P.data()[i];
        P.data()[i] = saved + eps;
        const double lp = m.forward_loss(d.input());
        P.data()[i] = saved - eps;
        const double lm = m.forward_loss(d.input());
        P.data()[i] = saved;
        const double numeric = (lp - lm) / (2 * eps);
        EXPECT_NEAR(g[size_t(i)], numeric,
                    2e-2 * std::max(std::fabs(double(g[size_t(i)])), std::fabs(numeric)) + 2e-3)
            << p.name << " " << family_name(f);
        ++checked;
      }
    EXPECT_EQ(checked, 3 * 16);
  }
}

TEST(Lora, MergedModelEqualsBasePlusAdapters) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(11);
    Data d = make_data({8, 8}, 12);
    double with_adapters = 0;
    {
      LoraConfig c = cfg(2, {"attn.qkv", "blocks.1.mlp.proj"});
      if (f == Family::Llama) c.targets.push_back("head");  // untied there
      c.rslora = true;
      Lora lora(m, c);
      EXPECT_EQ(lora.target_names().size(), f == Family::Llama ? 4u : 3u);
      EXPECT_NEAR(c.scale(), 4 / std::sqrt(2.0), 1e-12);
      randomise_b(lora);
      with_adapters = m.forward_loss(d.input());
      lora.merge_into_base();
    }  // adapters detached: the merged weights alone
    const double merged = m.forward_loss(d.input());
    EXPECT_NEAR(merged, with_adapters, 1e-5 * std::fabs(with_adapters)) << family_name(f);
    EXPECT_TRUE(m.params().info("blocks.0.attn.qkv.weight").trainable);  // flags restored
  }
}

TEST(Lora, TargetsThatMatchNothingAreErrors) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  EXPECT_THROW(Lora(m, cfg(2, {"q_proj"})), Error);
  EXPECT_THROW(Lora(m, cfg(2, {"kv"})), Error);    // a suffix must be whole name parts
  EXPECT_THROW(Lora(m, cfg(2, {"head"})), Error);  // tied to the embedding here
  LoraConfig c = cfg(0);
  EXPECT_THROW(Lora(m, c), Error);
}
