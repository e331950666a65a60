// The Llama-layout families' options of the Decoder: q/k/v biases (Qwen2), per-head q/k RMSNorm
// (Qwen3) and the sliding window (Mistral): gradients against finite differences, the float64
// reference forward, recompute modes, and the window's refusal past its length.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "model/model_test_util.h"
#include "model/reference_decoder.h"

using namespace loom;

namespace {

using test::Data;
using test::make_data;

ModelConfig qwen2() {
  ModelConfig c = test::tiny(Family::Llama);
  c.qkv_bias = true;
  c.tied = true;
  return c;
}

ModelConfig qwen3() {
  ModelConfig c = test::tiny(Family::Llama);
  c.qk_norm = true;
  return c;
}

// Every parameter drawn at random (norm weights around 1), so that the biases and the q/k norm
// weights, which start at 0 and 1, carry a gradient that is not a special case.
void randomise(ParamSet& P, uint64_t seed) {
  for (const ParamInfo& p : P.infos()) {
    const bool norm = p.name.find("norm") != std::string::npos;
    for (int64_t i = 0; i < p.numel; ++i) {
      const float u = uniform_at(seed, 7, uint64_t(p.offset + i)) - 0.5f;
      P.data()[p.offset + i] = norm ? 1.f + 0.4f * u : 0.8f * u;
    }
  }
}

void gradient_check(const ModelConfig& c, const char* what) {
  Decoder m(c, cpu_backend());
  m.params().init(3);
  randomise(m.params(), 3);
  Data d = make_data({5, 7}, c.vocab, 11);
  ParamSet& P = m.params();
  P.zero_grad();
  m.forward_backward(d.input(), 1.f);
  const std::vector<float> g(P.grad(), P.grad() + P.total());
  EXPECT_GT(test::expect_gradients_match_differences(m, P, d, g, what), 40);
}

TEST(DecoderFamilies, GradientCheckQkvBias) {
  Decoder m(qwen2(), cpu_backend());
  EXPECT_TRUE(m.params().has("blocks.0.attn.qkv.bias"));
  EXPECT_FALSE(m.params().has("blocks.0.attn.proj.bias"));
  EXPECT_FALSE(m.params().has("blocks.0.norm1.bias"));
  gradient_check(qwen2(), "qwen2");
}

TEST(DecoderFamilies, GradientCheckQkNorm) {
  Decoder m(qwen3(), cpu_backend());
  EXPECT_EQ(m.params().info("blocks.1.attn.q_norm.weight").numel, 4);
  EXPECT_EQ(m.params().info("blocks.1.attn.k_norm.weight").numel, 4);
  gradient_check(qwen3(), "qwen3");
}

TEST(DecoderFamilies, ParameterCountsIncludeTheFamiliesTensors) {
  for (const ModelConfig& c : {qwen2(), qwen3()}) {
    Decoder m(c, cpu_backend());
    int64_t n = 0;
    for (const ParamInfo& p : m.params().infos()) n += p.numel;
    EXPECT_EQ(n, c.num_params()) << c.fingerprint();
  }
}

TEST(DecoderFamilies, LogProbsMatchTheReference) {
  for (const ModelConfig& c : {qwen2(), qwen3()}) {
    Decoder m(c, cpu_backend());
    m.params().init(5);
    randomise(m.params(), 5);
    const std::vector<int32_t> seq = {3, 17, 9, 30, 1, 4, 22, 8, 8, 15};
    Data d;
    d.tokens = seq;
    d.targets.assign(seq.begin() + 1, seq.end());
    d.targets.push_back(-1);
    for (int i = 0; i < int(seq.size()); ++i) d.positions.push_back(i);
    d.cu = {0, int32_t(seq.size())};
    StepOutputs out;
    out.want_token_logprobs = true;
    m.forward_loss(d.input(), &out);
    const auto lp = ref::ReferenceDecoder(m).log_probs(seq);
    for (size_t i = 0; i + 1 < seq.size(); ++i)
      EXPECT_NEAR(out.token_logprobs[i], lp[i][size_t(seq[i + 1])], 1e-4)
          << c.fingerprint() << " position " << i;
  }
}

TEST(DecoderFamilies, RecomputeModesGiveIdenticalGradients) {
  for (const ModelConfig& c : {qwen2(), qwen3()}) {
    std::vector<float> ref;
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      Decoder m(c, cpu_backend(), r);
      m.params().init(5);
      randomise(m.params(), 5);
      m.params().zero_grad();
      Data d = make_data({9, 3, 4}, c.vocab, 2);
      m.forward_backward(d.input(), 0.1f);
      std::vector<float> g(m.params().grad(), m.params().grad() + m.params().total());
      if (ref.empty())
        ref = g;
      else
        EXPECT_EQ(0, std::memcmp(ref.data(), g.data(), g.size() * 4))
            << c.fingerprint() << " " << recompute_name(r);
    }
  }
}

TEST(DecoderFamilies, FromConfigKeys) {
  const ModelConfig c = model_config_from(
      Config::parse("[model]\npreset = \"tiny-llama\"\nqkv_bias = true\nqk_norm = true\n"
                    "sliding_window = 64\n",
                    "test"));
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 64);
  EXPECT_NE(c.fingerprint(), model_preset("tiny-llama").fingerprint());
}

TEST(DecoderFamilies, SlidingWindowRunsBelowItAndIsRefusedPastIt) {
  ModelConfig c = test::tiny(Family::Llama);
  c.sliding_window = 8;
  Decoder m(c, cpu_backend());
  m.params().init(1);
  ModelConfig plain = c;
  plain.sliding_window = 0;
  Decoder full(plain, cpu_backend());
  full.params().init(1);
  // Within the window every earlier position is in it: the same loss as full attention.
  const Data inside = make_data({8, 5}, c.vocab, 4);
  EXPECT_EQ(m.forward_loss(inside.input()), full.forward_loss(inside.input()));
  const Data past = make_data({9}, c.vocab, 4);
  try {
    m.forward_loss(past.input());
    FAIL() << "a position past the window ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 8 reaches past model.sliding_window = 8"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
