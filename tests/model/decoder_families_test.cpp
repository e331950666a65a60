// The Llama-layout families' options of the Decoder: q/k/v biases (Qwen2), per-head q/k RMSNorm
// (Qwen3), the sliding window (Mistral) and Gemma's (GeGLU, sandwich norms, scaled embedding,
// exact windows on a layer pattern, soft-capped scores and logits, query_pre_attn_scalar, a
// local RoPE base): gradients against finite differences, the float64 reference forward,
// recompute modes, and the window's refusal past its length.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "model/mirror_communicator.h"
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

// Gemma 2's options on the tiny shape: head_dim 6 (H * D = 24, not d_model 16), windows of 3
// on every other layer, caps that bind on random weights.
ModelConfig gemma2() {
  ModelConfig c = test::tiny(Family::Llama);
  c.head_dim = 6;
  c.tied = true;
  c.geglu = true;
  c.embed_scale = true;
  c.sandwich_norm = true;
  c.sliding_window = 3;
  c.window_pattern = 2;
  c.attn_softcap = 1.0f;
  c.final_softcap = 2.0f;
  c.attn_scalar = 5.f;
  return c;
}

// Gemma 3's: q/k norms, 3 layers with the last global, a local RoPE base, no caps.
ModelConfig gemma3() {
  ModelConfig c = gemma2();
  c.n_layer = 3;
  c.qk_norm = true;
  c.window_pattern = 3;
  c.attn_softcap = 0.f;
  c.final_softcap = 0.f;
  c.rope_theta = 1e6f;
  c.rope_local_theta = 500.f;
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

// One option at a time, so that a wrong gradient names its op.
TEST(DecoderFamilies, GradientCheckGemmaOps) {
  ModelConfig base = test::tiny(Family::Llama);
  ModelConfig g = base;
  g.geglu = true;
  gradient_check(g, "geglu");
  g = base;
  g.embed_scale = true;
  g.tied = true;
  gradient_check(g, "embed_scale");
  g = base;
  g.sandwich_norm = true;
  gradient_check(g, "sandwich_norm");
  g = base;
  g.sliding_window = 3;
  g.window_pattern = 2;
  g.rope_local_theta = 300.f;
  gradient_check(g, "window_pattern");
  g = base;
  g.attn_softcap = 0.7f;
  gradient_check(g, "attn_softcap");
  g = base;
  g.final_softcap = 1.5f;
  gradient_check(g, "final_softcap");
  g = base;
  g.attn_scalar = 3.f;
  g.head_dim = 6;
  gradient_check(g, "attn_scalar");
}

TEST(DecoderFamilies, GradientCheckGemma2And3) {
  Decoder m(gemma2(), cpu_backend());
  EXPECT_TRUE(m.params().has("blocks.1.attn.post_norm.weight"));
  EXPECT_TRUE(m.params().has("blocks.1.mlp.post_norm.weight"));
  gradient_check(gemma2(), "gemma2");
  gradient_check(gemma3(), "gemma3");
}

// A window W: query i sees keys i - W + 1 .. i; a window at least as long as the sequence, or
// a global layer, is full causal attention; softcap 0 is no cap.
TEST(DecoderFamilies, GemmaWindowAndCapsChangeOnlyWhatTheyShould) {
  ModelConfig c = gemma2();
  c.attn_softcap = 0.f;
  c.final_softcap = 0.f;
  ModelConfig wide = c;
  wide.sliding_window = 16;  // max_seq: never binds
  ModelConfig none = c;
  none.sliding_window = 0;
  none.window_pattern = 0;
  auto loss = [](const ModelConfig& cfg, const Data& d) {
    Decoder m(cfg, cpu_backend());
    m.params().init(4);
    randomise(m.params(), 4);
    return m.forward_loss(d.input());
  };
  const Data d = make_data({9, 6}, c.vocab, 3);
  EXPECT_NEAR(loss(wide, d), loss(none, d), 1e-4);
  EXPECT_GT(std::fabs(loss(c, d) - loss(none, d)), 1e-3);
  const Data short_seqs = make_data({3, 2, 3}, c.vocab, 3);  // within the window
  EXPECT_NEAR(loss(c, short_seqs), loss(none, short_seqs), 1e-4);
  ModelConfig capped = c;
  capped.final_softcap = 2.f;
  EXPECT_GT(std::fabs(loss(capped, d) - loss(c, d)), 1e-3);
}

// Under the bf16 policy (activations stored in bf16) Gemma's ops give the fp32 loss to bf16's
// precision, and gradients of the same direction.
TEST(DecoderFamilies, GemmaUnderBf16ActivationsFollowsFp32) {
  for (const ModelConfig& c : {gemma2(), gemma3()}) {
    const Data d = make_data({9, 6}, c.vocab, 3);
    std::vector<float> g[2];
    double loss[2];
    for (int k = 0; k < 2; ++k) {
      Decoder m(c, cpu_backend(), Recompute::None, k == 0 ? DType::F32 : DType::BF16);
      m.params().init(4);
      randomise(m.params(), 4);
      m.params().zero_grad();
      loss[k] = m.forward_backward(d.input(), 1.f);
      g[k].assign(m.params().grad(), m.params().grad() + m.params().total());
    }
    EXPECT_NEAR(loss[1], loss[0], 2e-2 * std::fabs(loss[0])) << c.fingerprint();
    double dot = 0, n0 = 0, n1 = 0;
    for (size_t i = 0; i < g[0].size(); ++i) {
      dot += double(g[0][i]) * g[1][i];
      n0 += double(g[0][i]) * g[0][i];
      n1 += double(g[1][i]) * g[1][i];
    }
    EXPECT_GT(dot / std::sqrt(n0 * n1), 0.99) << c.fingerprint();
  }
}

TEST(DecoderFamilies, GemmaRefusesTensorParallelismAndOtherBackends) {
  test::MirrorCommunicator comm(cpu_backend());
  TensorParallel tp;
  tp.size = 2;
  tp.comm = &comm;
  try {
    tp.validate(gemma2());
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported under tensor parallelism"),
              std::string::npos)
        << e.what();
  }
  ModelConfig moe = gemma2();
  moe.n_experts = 4;
  EXPECT_THROW(moe.validate(), Error);
  ModelConfig gpt = gemma2();
  gpt.family = Family::GPT2;
  EXPECT_THROW(gpt.validate(), Error);
}

TEST(DecoderFamilies, ParameterCountsIncludeTheFamiliesTensors) {
  for (const ModelConfig& c : {qwen2(), qwen3(), gemma2(), gemma3()}) {
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
  for (const ModelConfig& c : {qwen2(), qwen3(), gemma2(), gemma3()}) {
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
  const ModelConfig g = model_config_from(
      Config::parse("[model]\npreset = \"tiny-llama\"\ngeglu = true\nembed_scale = true\n"
                    "sandwich_norm = true\nsliding_window = 32\nwindow_pattern = 6\n"
                    "rope_local_theta = 10000\nattn_softcap = 50\nfinal_softcap = 30\n"
                    "attn_scalar = 256\n",
                    "test"));
  EXPECT_TRUE(g.geglu && g.embed_scale && g.sandwich_norm);
  EXPECT_EQ(g.window_pattern, 6);
  EXPECT_EQ(g.layer_window(0), 32);
  EXPECT_EQ(g.layer_window(5), 0);
  EXPECT_EQ(g.layer_rope_theta(0), 10000.f);
  EXPECT_EQ(g.layer_rope_theta(5), g.rope_theta);
  EXPECT_EQ(g.attn_scale(), 1.f / 16.f);
  EXPECT_EQ(g.final_softcap, 30.f);
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
