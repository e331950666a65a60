// The step API post-training and serving build on: per-token loss weights, per-sequence
// log-probabilities, frozen parameters, and the forward-only path (with an attention override).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "model/model_test_util.h"
#include "model/reference_decoder.h"
#include "same_bits.h"

using namespace loom;

namespace {

using test::Data;
using test::tiny;

// Packed sequences of the given lengths; each target is the next token of its sequence (the
// last one a random id), as a language-model batch has it.
Data make_data(const std::vector<int>& lens, int vocab, uint64_t seed) {
  Data d;
  d.cu.push_back(0);
  for (int len : lens) {
    const size_t first = d.tokens.size();
    for (int t = 0; t < len; ++t) {
      d.tokens.push_back(static_cast<int32_t>(uniform_at(seed, 1, d.tokens.size()) * vocab));
      d.positions.push_back(t);
    }
    for (int t = 0; t < len; ++t)
      d.targets.push_back(t + 1 < len ? d.tokens[first + t + 1]
                                      : static_cast<int32_t>(uniform_at(seed, 2, first) * vocab));
    d.cu.push_back(static_cast<int32_t>(d.tokens.size()));
  }
  return d;
}

std::vector<float> grads(Decoder& m) {
  return {m.params().grad(), m.params().grad() + m.params().total()};
}

}  // namespace

// A weight of 0 masks a token exactly as a target of -1 does: same loss, same gradient bits.
TEST(StepApi, ZeroWeightEqualsIgnoredTarget) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(7);
    Data masked = make_data({7, 5}, 32, 3);
    masked.weights.assign(masked.tokens.size(), 1.f);
    Data ignored = masked;
    ignored.weights.clear();
    for (int i : {0, 1, 2, 8}) {  // a "prompt" and one token of the second sequence
      masked.weights[i] = 0.f;
      ignored.targets[i] = -1;
    }
    m.params().zero_grad();
    const double a = m.forward_backward(masked.input(), 0.25f);
    const auto ga = grads(m);
    m.params().zero_grad();
    const double b = m.forward_backward(ignored.input(), 0.25f);
    EXPECT_EQ(a, b) << family_name(f);
    EXPECT_TRUE(loom::test::same_bits(ga, grads(m))) << family_name(f);
  }
}

// Weights scale each token's loss and gradient: a weight of 2 everywhere doubles every gradient
// exactly (scaling by a power of two is exact), and mixed weights (negative included) match
// finite differences of the weighted loss.
TEST(StepApi, WeightsScaleLossAndGradient) {
  Decoder m(tiny(Family::Llama), cpu_backend());
  m.params().init(9);
  Data d = make_data({6, 6}, 32, 5);
  m.params().zero_grad();
  const double plain = m.forward_backward(d.input(), 1.f);
  const auto g1 = grads(m);
  d.weights.assign(d.tokens.size(), 2.f);
  m.params().zero_grad();
  EXPECT_EQ(m.forward_backward(d.input(), 1.f), 2 * plain);
  const auto g2 = grads(m);
  for (size_t i = 0; i < g1.size(); ++i) ASSERT_EQ(g2[i], 2 * g1[i]) << i;

  for (size_t i = 0; i < d.weights.size(); ++i) d.weights[i] = float(int(i % 5) - 2) * 0.5f;
  ParamSet& P = m.params();
  P.zero_grad();
  m.forward_backward(d.input(), 1.f);
  EXPECT_GT(test::expect_gradients_match_differences(m, P, d, grads(m), "weighted tokens"), 20);
}

// A pass that carries its normalisation in the token weights (dloss = 1: DPO, GRPO) sets
// aux_weight so that a MoE model's auxiliary loss is averaged as the trainer's dloss averages
// it: weights w everywhere with aux_weight w equal dloss w (a power of two: exact). Without it
// the auxiliary gradient would be weighted by the pass's token count (1/w times too much).
TEST(StepApi, AuxWeightAveragesTheMoeAuxiliaryLoss) {
  ModelConfig c = model_preset("tiny-moe");
  c.n_layer = 2, c.d_model = 16, c.n_head = 4, c.n_kv_head = 4, c.head_dim = 4, c.d_ff = 32;
  c.vocab = 32, c.max_seq = 16, c.n_experts = 4, c.top_k = 2, c.aux_loss_coeff = 0.1;
  Decoder m(c, cpu_backend());
  m.params().init(11);
  Data d = make_data({7, 9}, 32, 13);
  const float w = 0.0625f;
  m.params().zero_grad();
  m.forward_backward(d.input(), w);
  const auto mean = grads(m);
  d.weights.assign(d.tokens.size(), w);
  ModelInput in = d.input();
  in.aux_weight = w;
  m.params().zero_grad();
  m.forward_backward(in, 1.f);
  EXPECT_TRUE(loom::test::same_bits(mean, grads(m)));
  in.aux_weight = -1.f;  // dloss = 1 for the auxiliary loss too
  m.params().zero_grad();
  m.forward_backward(in, 1.f);
  EXPECT_FALSE(loom::test::same_bits(mean, grads(m)));
}

// Per-sequence sums of log p(target) (and per-token values) against a float64 forward written
// from the definitions; the same from forward_backward and the forward-only forward_loss.
TEST(StepApi, SequenceLogProbsMatchFloat64Reference) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(11);
    Data d = make_data({9, 4, 7}, 32, 8);
    d.targets[10] = -1;  // excluded from its sequence's sum
    ref::ReferenceDecoder reference(m);
    StepOutputs fb, fo;
    fo.want_token_logprobs = true;
    m.params().zero_grad();
    const double loss_fb = m.forward_backward(d.input(), 1.f, &fb);
    const double loss_fo = m.forward_loss(d.input(), &fo);
    EXPECT_EQ(loss_fb, loss_fo) << family_name(f);
    ASSERT_EQ(fb.seq_logprobs.size(), 3u);
    EXPECT_TRUE(fb.token_logprobs.empty());  // not asked for
    ASSERT_EQ(fo.token_logprobs.size(), d.tokens.size());
    double total = 0;
    for (int s = 0; s < 3; ++s) {
      const std::vector<int32_t> seq(d.tokens.begin() + d.cu[s], d.tokens.begin() + d.cu[s + 1]);
      const auto lp = reference.log_probs(seq);
      double want = 0;
      for (int i = d.cu[s]; i < d.cu[s + 1]; ++i) {
        const int t = d.targets[i];
        const double r = t >= 0 ? lp[i - d.cu[s]][t] : 0.0;
        want += r;
        EXPECT_NEAR(fo.token_logprobs[i], r, 1e-4) << family_name(f) << " token " << i;
      }
      EXPECT_NEAR(fb.seq_logprobs[s], want, 1e-4 * (1 + std::fabs(want))) << "sequence " << s;
      EXPECT_EQ(fb.seq_logprobs[s], fo.seq_logprobs[s]);
      total += fb.seq_logprobs[s];
    }
    EXPECT_NEAR(-total, loss_fb, 1e-3);
  }
}

// Frozen parameters: their gradient buffers are never written (a sentinel survives), and every
// other gradient is bit-identical to the run where nothing is frozen.
TEST(StepApi, FrozenParametersGetNoGradientAndChangeNothingElse) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(13);
    Data d = make_data({8, 8}, 32, 2);
    m.params().zero_grad();
    m.forward_backward(d.input(), 0.5f);
    const auto full = grads(m);

    ParamSet& P = m.params();
    std::vector<std::string> frozen = {"embed.wte", "blocks.0.attn.qkv.weight",
                                       "blocks.1.mlp.fc.weight", "blocks.0.norm2.weight",
                                       "final_norm.weight"};
    if (f == Family::Llama) frozen.push_back("head.weight");
    if (f == Family::GPT2) frozen.push_back("embed.wpe");
    for (const auto& n : frozen) P.set_trainable(n, false);
    EXPECT_TRUE(P.any_frozen());
    P.zero_grad();
    const float sentinel = 12345.f;
    for (const auto& n : frozen) {
      const ParamInfo& p = P.info(n);
      std::fill(P.grad() + p.offset, P.grad() + p.offset + p.numel, sentinel);
    }
    m.forward_backward(d.input(), 0.5f);
    for (const ParamInfo& p : P.infos()) {
      const bool is_frozen = !p.trainable;
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
        if (is_frozen)
          ASSERT_EQ(P.grad()[i], sentinel) << p.name;
        else
          ASSERT_EQ(P.grad()[i], full[i]) << p.name << " " << family_name(f);
      }
    }
  }
}

// The forward-only path keeps one layer's activations: it needs less memory than training,
// gives the training forward's loss bit for bit, and its logits are the reference's.
TEST(StepApi, ForwardOnlyPathMatchesTrainingForward) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    ModelConfig c = tiny(f);
    c.n_layer = 4;
    Decoder m(c, cpu_backend());
    m.params().init(17);
    Data d = make_data({12, 10}, 32, 4);
    m.params().zero_grad();
    const double trained = m.forward_backward(d.input(), 1.f);
    EXPECT_EQ(m.forward_loss(d.input()), trained);
    EXPECT_LT(m.forward_only_bytes(), m.activation_bytes() / 2);

    const std::vector<int> rows = {11, 0, 21, 12};
    std::vector<float> logits(rows.size() * c.vocab);
    m.forward_logits(d.input(), rows, logits.data());
    ref::ReferenceDecoder reference(m);
    const std::vector<int32_t> s0(d.tokens.begin(), d.tokens.begin() + 12),
        s1(d.tokens.begin() + 12, d.tokens.end());
    const auto lp0 = reference.log_probs(s0), lp1 = reference.log_probs(s1);
    const ref::Vec* want[] = {&lp0[11], &lp0[0], &lp1[9], &lp1[0]};
    for (size_t r = 0; r < rows.size(); ++r) {
      // Compare log-softmax of the model's logits with the reference's.
      const float* x = logits.data() + r * c.vocab;
      double mx = x[0], s = 0;
      for (int j = 0; j < c.vocab; ++j) mx = std::max(mx, double(x[j]));
      for (int j = 0; j < c.vocab; ++j) s += std::exp(x[j] - mx);
      for (int j = 0; j < c.vocab; ++j)
        ASSERT_NEAR(x[j] - mx - std::log(s), (*want[r])[j], 1e-4) << "row " << rows[r];
    }
  }
}

// ModelInput::logit_scale s: the loss is that of softmax(s z), z the unscaled logits (taken from
// forward_logits at s = 1 and scaled here, in double), per token and summed; forward_logits
// returns s z; the gradient of the weighted loss matches finite differences with s applied.
TEST(StepApi, LogitScaleIsTheSoftmaxTemperature) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    ModelConfig c = tiny(f);
    Decoder m(c, cpu_backend());
    m.params().init(21);
    Data d = make_data({8, 6}, 32, 6);
    std::vector<int> rows(d.tokens.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int(i);
    std::vector<float> z(rows.size() * size_t(c.vocab)), sz(z.size());
    m.forward_logits(d.input(), rows, z.data());
    d.logit_scale = 2.f;  // temperature 0.5
    m.forward_logits(d.input(), rows, sz.data());
    StepOutputs out;
    out.want_token_logprobs = true;
    m.forward_loss(d.input(), &out);
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* x = z.data() + i * size_t(c.vocab);
      double mx = -1e300, sum = 0;
      for (int j = 0; j < c.vocab; ++j) mx = std::max(mx, 2.0 * x[j]);
      for (int j = 0; j < c.vocab; ++j) sum += std::exp(2.0 * x[j] - mx);
      const double want = 2.0 * x[d.targets[i]] - mx - std::log(sum);
      EXPECT_NEAR(out.token_logprobs[i], want, 1e-5) << family_name(f) << " token " << i;
      for (int j = 0; j < c.vocab; ++j)
        ASSERT_NEAR(sz[i * size_t(c.vocab) + size_t(j)], 2.0 * x[j], 1e-5) << "row " << i;
    }
    for (size_t i = 0; i < d.tokens.size(); ++i) d.weights.push_back(float(int(i % 5) - 2) * 0.5f);
    ParamSet& P = m.params();
    P.zero_grad();
    m.forward_backward(d.input(), 1.f);
    EXPECT_GT(test::expect_gradients_match_differences(m, P, d, grads(m), "logit scale 2"), 20);
  }
  Decoder m(tiny(Family::Llama), cpu_backend());
  Data d = make_data({4}, 32, 1);
  d.logit_scale = 0.f;
  EXPECT_THROW(m.forward_loss(d.input()), Error);
}

// The value head (model.value_head): each sequence's score is score.weight . h at its last row,
// h the final norm's output of a float64 forward; the gradient of sum_j g_j score_j matches
// finite differences (every parameter kind, the head included); bad rows are refused.
TEST(StepApi, ValueHeadScoresTheLastTokenAndItsGradientMatchesDifferences) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    ModelConfig c = tiny(f);
    c.value_head = true;
    Decoder m(c, cpu_backend());
    m.params().init(23);
    ASSERT_TRUE(m.params().has("score.weight"));
    Data d = make_data({7, 5, 6}, 32, 9);
    const std::vector<int32_t> rows = {6, 11, 17};
    const std::vector<float> g = {0.5f, -1.25f, 2.f};
    ModelInput in = d.input();
    in.value_rows = rows.data();
    in.n_values = 3;
    StepOutputs out;
    m.forward_loss(in, &out);
    ASSERT_EQ(out.values.size(), 3u);
    ref::ReferenceDecoder reference(m);
    const float* w = m.params().data() + m.params().info("score.weight").offset;
    for (int s = 0; s < 3; ++s) {
      const std::vector<int32_t> seq(d.tokens.begin() + d.cu[s], d.tokens.begin() + d.cu[s + 1]);
      const auto h = reference.final_hidden(seq);
      double want = 0;
      for (int k = 0; k < c.d_model; ++k) want += double(w[k]) * h.back()[size_t(k)];
      EXPECT_NEAR(out.values[size_t(s)], want, 1e-4) << family_name(f) << " sequence " << s;
    }
    in.value_grads = g.data();
    ParamSet& P = m.params();
    P.zero_grad();
    const double sum = m.forward_backward(in, 1.f);
    EXPECT_NEAR(sum, 0.5 * out.values[0] - 1.25 * out.values[1] + 2 * out.values[2], 1e-5);
    const std::vector<float> grad = grads(m);
    const float eps = 1e-2f;
    int checked = 0;
    for (const ParamInfo& p : P.infos())
      for (int k = 0; k < 3; ++k) {
        const int64_t i = p.offset + (p.numel - 1) * k / 2;
        const float saved = P.data()[i];
        P.data()[i] = saved + eps;
        const double lp = m.forward_loss(in);
        P.data()[i] = saved - eps;
        const double lm = m.forward_loss(in);
        P.data()[i] = saved;
        const double numeric = (lp - lm) / (2 * eps), a = grad[size_t(i)];
        EXPECT_NEAR(a, numeric, 2e-2 * std::max(std::fabs(a), std::fabs(numeric)) + 2e-3)
            << family_name(f) << " " << p.name;
        ++checked;
      }
    EXPECT_GT(checked, 20);
    const std::vector<int32_t> bad = {6, 40};
    in.value_rows = bad.data();
    in.n_values = 2;
    EXPECT_THROW(m.forward_loss(in), Error);
  }
  Decoder lm(tiny(Family::Llama), cpu_backend());  // no value head
  Data d = make_data({4}, 32, 1);
  const int32_t row = 3;
  ModelInput in = d.input();
  in.value_rows = &row;
  in.n_values = 1;
  EXPECT_THROW(lm.forward_loss(in), Error);
}

namespace {
// An attention override that records its calls and runs the backend's own attention over the
// packed batch: the logits must not change.
struct RecordingAttention : ForwardAttention {
  const ModelInput* in = nullptr;
  std::vector<int> layers;
  void forward(int layer, const float* qkv, int ld, int Hq, int Hkv, int D, float scale, int window,
               float softcap, float* out) override {
    EXPECT_EQ(window, 0);
    EXPECT_EQ(softcap, 0.f);
    layers.push_back(layer);
    std::vector<float> lse(size_t(in->N) * Hq);
    cpu_backend().attention_forward(out, lse.data(), qkv, qkv + Hq * D, qkv + (Hq + Hkv) * D, ld,
                                    in->cu_seqlens, in->nseq, Hq, Hkv, D, scale);
  }
};
}  // namespace

TEST(StepApi, AttentionOverrideReplacesEveryLayersCore) {
  Decoder m(tiny(Family::Llama), cpu_backend());
  m.params().init(19);
  Data d = make_data({5, 9}, 32, 6);
  const std::vector<int> rows = {4, 13};
  std::vector<float> plain(2 * 32), overridden(2 * 32);
  m.forward_logits(d.input(), rows, plain.data());
  const ModelInput in = d.input();
  RecordingAttention att;
  att.in = &in;
  m.forward_logits(in, rows, overridden.data(), &att);
  EXPECT_EQ(att.layers, (std::vector<int>{0, 1}));
  EXPECT_TRUE(loom::test::same_bits(plain, overridden));
  // The override is gone afterwards, and training still works (its buffers are untouched).
  m.params().zero_grad();
  EXPECT_GT(m.forward_backward(d.input(), 1.f), 0.0);
  EXPECT_EQ(att.layers.size(), 2u);
}

TEST(StepApi, BadRowsAreErrors) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(1);
  Data d = make_data({4}, 32, 1);
  std::vector<float> logits(5 * 32);
  EXPECT_THROW(m.forward_logits(d.input(), {4}, logits.data()), Error);
  EXPECT_THROW(m.forward_logits(d.input(), {0, 1, 2, 3, 0}, logits.data()), Error);
}

namespace {
// y += x D^T for a full delta matrix D [out, in]: what a merged adapter would add to W.
struct DeltaAdapter : LinearAdapter {
  std::vector<float> D, dD;
  int in = 0, out = 0;
  void forward(Backend& be, float* y, const float* x, int N, int) override {
    be.gemm(false, true, N, out, in, 1.f, x, in, D.data(), in, 1.f, y, out);
  }
  void backward(Backend& be, float* dx, const float* dy, const float* x, int N, int) override {
    if (dx) be.gemm(false, false, N, in, out, 1.f, dy, out, D.data(), in, 1.f, dx, in);
    be.gemm(true, false, out, in, N, 1.f, dy, out, x, in, 1.f, dD.data(), in);
  }
};

}  // namespace

// An adapter on a linear layer acts as a change of its weight: the model with W and adapter
// D equals the model with weight W + D (logits within fp32 rounding), and the adapter's
// gradient equals that weight's gradient.
TEST(Linear, AdapterEqualsMergedWeight) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend()), merged(tiny(f), cpu_backend());
    m.params().init(23);
    merged.params().init(23);
    const std::string target = "blocks.1.mlp.fc";
    int in = 0, out = 0;
    for (const auto& l : m.linears())
      if (l.name == target) in = l.in, out = l.out;
    ASSERT_GT(in * out, 0);
    DeltaAdapter a;
    a.in = in, a.out = out;
    a.D.resize(size_t(in) * out);
    a.dD.assign(a.D.size(), 0.f);
    for (size_t i = 0; i < a.D.size(); ++i) a.D[i] = 0.1f * (uniform_at(5, 6, i) - 0.5f);
    float* W = merged.params().ptr(target + ".weight");
    for (size_t i = 0; i < a.D.size(); ++i) W[i] += a.D[i];
    m.attach_adapter(target, &a);
    m.params().set_trainable(target + ".weight", false);  // LoRA's base: frozen

    Data d = make_data({8, 6}, 32, 7);
    m.params().zero_grad();
    merged.params().zero_grad();
    const double la = m.forward_backward(d.input(), 1.f),
                 lb = merged.forward_backward(d.input(), 1.f);
    EXPECT_NEAR(la, lb, 1e-5 * std::fabs(lb)) << family_name(f);
    const float* g = merged.params().grad_ptr(target + ".weight");
    for (size_t i = 0; i < a.dD.size(); ++i)
      ASSERT_NEAR(a.dD[i], g[i], 1e-5f + 1e-4f * std::fabs(g[i])) << i;
    // Detached, the model is the base again.
    m.attach_adapter(target, nullptr);
    Decoder base(tiny(f), cpu_backend());
    base.params().init(23);
    EXPECT_EQ(m.forward_loss(d.input()), base.forward_loss(d.input()));
  }
}

TEST(Linear, RecipeComputesEveryGemmOfItsLayer) {
  Decoder m(tiny(Family::GPT2), cpu_backend()), plain(tiny(Family::GPT2), cpu_backend());
  m.params().init(29);
  plain.params().init(29);
  test::CountingRecipe qkv, head;
  m.attach_recipe("blocks.0.attn.qkv", &qkv);
  m.attach_recipe("head", &head);
  Data d = make_data({8, 8}, 32, 9);
  m.params().zero_grad();
  plain.params().zero_grad();
  EXPECT_EQ(m.forward_backward(d.input(), 1.f), plain.forward_backward(d.input(), 1.f));
  EXPECT_TRUE(loom::test::same_bits(grads(m), grads(plain)));
  EXPECT_EQ(qkv.forwards, 1);
  EXPECT_EQ(qkv.backwards, 1);
  EXPECT_EQ(head.forwards, 1);  // 16 rows: one head chunk
  EXPECT_EQ(head.backwards, 1);
  EXPECT_THROW(m.attach_recipe("blocks.7.attn.qkv", &qkv), Error);
  EXPECT_THROW(m.attach_adapter("blocks.0.mlp.gate", nullptr), Error);
}
