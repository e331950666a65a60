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
    EXPECT_EQ(test::expect_gradients_match_differences(m, P, d, g, family_name(f)), 3 * 16);
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

// LoRA dropout (PEFT's lora_dropout) acts only while the trainer has set a micro-batch: without
// one the adapted model is exactly the dropout-free one (evaluation, serving); with one the
// mask is a function of the micro-batch key alone (two passes agree, another key differs).
TEST(Lora, DropoutActsOnlyForATrainingMicroBatchAndIsKeyed) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(13);
    Data d = make_data({7, 6}, 14);
    double plain = 0;
    {
      Lora lora(m, cfg(3));
      randomise_b(lora);
      plain = m.forward_loss(d.input());
    }
    LoraConfig c = cfg(3);
    c.dropout = 0.3;
    Lora lora(m, c);
    randomise_b(lora);  // the same B (and the same seed draws the same A)
    EXPECT_FALSE(lora.dropout_active());
    EXPECT_EQ(m.forward_loss(d.input()), plain) << family_name(f);
    lora.set_dropout_batch(4);
    const double a = m.forward_loss(d.input()), b = m.forward_loss(d.input());
    EXPECT_EQ(a, b) << family_name(f);
    EXPECT_NE(a, plain) << family_name(f);
    lora.set_dropout_batch(5);
    EXPECT_NE(m.forward_loss(d.input()), a) << family_name(f);
    lora.clear_dropout();
    EXPECT_EQ(m.forward_loss(d.input()), plain) << family_name(f);
  }
}

// With dropout on, the gradients of A and B (and through the mask, of everything upstream of
// an adapter) are those of the dropped function: finite differences under the same mask.
TEST(Lora, DropoutGradientsMatchFiniteDifferences) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(17);
    LoraConfig c = cfg(3);
    c.dropout = 0.25;
    Lora lora(m, c);
    randomise_b(lora);
    Data d = make_data({6, 5}, 18);
    ParamSet& P = lora.params();
    lora.set_dropout_batch(11);
    P.zero_grad();
    m.forward_backward(d.input(), 1.f);
    const std::vector<float> g(P.grad(), P.grad() + P.total());
    EXPECT_EQ(test::expect_gradients_match_differences(m, P, d, g, family_name(f)), 3 * 16);
    // The input gradient through a dropped adapter: unfreeze one base weight upstream of the
    // adapters (block 0's first norm) and check it as well.
    const std::string up = "blocks.0.norm1.weight";
    m.params().set_trainable(up, true);
    m.params().zero_grad();
    P.zero_grad();
    m.forward_backward(d.input(), 1.f);
    const std::vector<float> gm(m.params().grad(), m.params().grad() + m.params().total());
    EXPECT_EQ(test::expect_gradients_match_differences(m, m.params(), d, gm, family_name(f), up),
              3);
    m.params().set_trainable(up, false);
    lora.clear_dropout();
  }
}

// The mask belongs to a token's row in the micro-batch, also on the output head, which runs
// over chunks of rows: identical sequences in the same place of two head chunks still get
// different masks (so different log-probabilities), while without dropout they are equal.
TEST(Lora, HeadDropoutMaskFollowsTheRowAcrossHeadChunks) {
  Decoder m(tiny(Family::Llama), cpu_backend());  // untied head
  m.params().init(19);
  const int L = 16, chunk = m.head_chunk();
  ASSERT_EQ(chunk % L, 0);
  const int nseq = 2 * chunk / L;
  Data one = make_data({L}, 20);
  Data d;
  d.cu.push_back(0);
  for (int s = 0; s < nseq; ++s) {
    d.tokens.insert(d.tokens.end(), one.tokens.begin(), one.tokens.end());
    d.targets.insert(d.targets.end(), one.targets.begin(), one.targets.end());
    d.positions.insert(d.positions.end(), one.positions.begin(), one.positions.end());
    d.cu.push_back(static_cast<int32_t>(d.tokens.size()));
  }
  LoraConfig c = cfg(2, {"head"});
  c.dropout = 0.5;
  Lora lora(m, c);
  randomise_b(lora);
  const int twin = chunk / L;  // sequence s + twin sits where s does, one head chunk later
  StepOutputs plain, dropped;
  m.forward_loss(d.input(), &plain);
  EXPECT_EQ(plain.seq_logprobs[0], plain.seq_logprobs[size_t(twin)]);
  lora.set_dropout_batch(3);
  m.forward_loss(d.input(), &dropped);
  lora.clear_dropout();
  EXPECT_NE(dropped.seq_logprobs[0], dropped.seq_logprobs[size_t(twin)]);
  EXPECT_NE(dropped.seq_logprobs[0], plain.seq_logprobs[0]);
}

TEST(Lora, DropoutOutsideZeroToOneIsAnError) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  for (double p : {-0.1, 1.0, 1.5, std::nan("")}) {
    LoraConfig c = cfg(2);
    c.dropout = p;
    EXPECT_THROW(Lora(m, c), Error) << p;
  }
}
