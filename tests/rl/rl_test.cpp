// GRPO: the loss's per-token weights against numeric derivatives (clipping, KL, importance
// weights), advantages, the built-in environments' exact rewards, and a synchronous run that
// raises the reward of a tiny model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/rng.h"
#include "rl/env.h"
#include "rl/grpo.h"
#include "rl/grpo_trainer.h"
#include "rl/rollout.h"
#include "rl/tp_gather.h"
#include "rl_test_util.h"

using namespace loom;
using namespace loom::rl;

namespace {

std::vector<GrpoSample> random_samples(bool with_ref, bool with_gen) {
  std::vector<GrpoSample> s(4);
  for (size_t k = 0; k < s.size(); ++k) {
    s[k].advantage = (k % 2 ? -1.0 : 1.0) * (0.5 + 0.3 * double(k));
    for (size_t t = 0; t < 3 + k; ++t) {
      const double u = uniform_at(1, k, t), v = uniform_at(2, k, t);
      s[k].logp.push_back(-1 - 2 * u);
      s[k].logp_old.push_back(-1 - 2 * u + 0.6 * (v - 0.5));  // ratios 0.74 .. 1.35: some clip
      if (with_ref) s[k].logp_ref.push_back(-1 - 2 * u + 0.3 * (uniform_at(3, k, t) - 0.5));
      if (with_gen)
        s[k].logp_gen.push_back(s[k].logp_old.back() + 0.2 * (uniform_at(4, k, t) - 0.5));
    }
  }
  return s;
}

}  // namespace

TEST(Grpo, TokenWeightsAreMinusTheLossGradient) {
  for (bool token_level : {true, false})
    for (double beta : {0.0, 0.1})
      for (bool gen : {false, true}) {
        GrpoConfig c;
        c.beta = beta;
        c.token_level = token_level;
        auto s = random_samples(beta > 0, gen);
        std::vector<std::vector<double>> w;
        const GrpoStats st = grpo_token_weights(s, c, &w);
        EXPECT_GT(st.clip_fraction, 0.0);  // the case covers active clipping
        for (size_t k = 0; k < s.size(); ++k)
          for (size_t t = 0; t < s[k].logp.size(); ++t) {
            const double e = 1e-6, saved = s[k].logp[t];
            s[k].logp[t] = saved + e;
            const double lp = grpo_token_weights(s, c, nullptr).loss;
            s[k].logp[t] = saved - e;
            const double lm = grpo_token_weights(s, c, nullptr).loss;
            s[k].logp[t] = saved;
            EXPECT_NEAR(w[k][t], -(lp - lm) / (2 * e), 1e-6)
                << "sample " << k << " token " << t << " beta " << beta;
          }
      }
}

TEST(Grpo, ClippingAndKlAtTheirDefinitions) {
  GrpoConfig c;
  GrpoSample up;  // A > 0, ratio e^0.5 = 1.65 > 1.28: clipped, no gradient
  up.advantage = 1;
  up.logp = {-1.0};
  up.logp_old = {-1.5};
  std::vector<std::vector<double>> w;
  auto st = grpo_token_weights({up}, c, &w);
  EXPECT_EQ(w[0][0], 0.0);
  EXPECT_NEAR(st.loss, -1.28, 1e-12);
  GrpoSample down = up;  // A < 0 with the same ratio: unclipped side, gradient rho * A
  down.advantage = -1;
  st = grpo_token_weights({down}, c, &w);
  EXPECT_NEAR(w[0][0], -std::exp(0.5), 1e-12);
  c.beta = 0.5;  // k3 of ref - logp = 0.2
  GrpoSample kl;
  kl.advantage = 0;
  kl.logp = {-2.0};
  kl.logp_old = {-2.0};
  kl.logp_ref = {-1.8};
  st = grpo_token_weights({kl}, c, &w);
  EXPECT_NEAR(st.kl, std::exp(0.2) - 0.2 - 1, 1e-12);
  EXPECT_NEAR(w[0][0], -0.5 * (1 - std::exp(0.2)), 1e-12);
}

TEST(Grpo, LogprobAndEntropyOfALogitRow) {
  double lp = 0, h = 0;
  const std::vector<float> flat(5, 0.7f);  // uniform: log p = -log 5, entropy log 5
  logprob_and_entropy(flat.data(), 5, 2, &lp, &h);
  EXPECT_NEAR(lp, -std::log(5.0), 1e-12);
  EXPECT_NEAR(h, std::log(5.0), 1e-12);
  // Two tokens with p = (1/(1+e), e/(1+e)): entropy -sum p log p, by hand.
  const std::vector<float> two = {0.f, 1.f};
  logprob_and_entropy(two.data(), 2, 0, &lp, &h);
  const double p0 = 1 / (1 + std::exp(1.0)), p1 = 1 - p0;
  EXPECT_NEAR(lp, std::log(p0), 1e-12);
  EXPECT_NEAR(h, -(p0 * std::log(p0) + p1 * std::log(p1)), 1e-12);
  // Large logits stay finite (the max is subtracted first); a near one-hot row has entropy ~0.
  const std::vector<float> peaked = {1000.f, 0.f, -50.f};
  logprob_and_entropy(peaked.data(), 3, 1, &lp, &h);
  EXPECT_NEAR(lp, -1000.0, 1e-9);
  EXPECT_GE(h, 0.0);
  EXPECT_LT(h, 1e-12);
  EXPECT_THROW(logprob_and_entropy(peaked.data(), 3, 3, &lp, &h), Error);
}

TEST(Grpo, GroupAdvantages) {
  GrpoConfig c;
  auto a = group_advantages({1, 0, 0, 1}, c);
  const double sd = std::sqrt(1.0 / 3.0);  // unbiased std of {1, 0, 0, 1}
  EXPECT_NEAR(a[0], 0.5 / (sd + 1e-6), 1e-9);
  EXPECT_NEAR(a[1], -0.5 / (sd + 1e-6), 1e-9);
  for (double x : group_advantages({0.3, 0.3, 0.3}, c)) EXPECT_EQ(x, 0.0);
  c.scale_by_std = false;  // Dr. GRPO
  EXPECT_NEAR(group_advantages({1, 0}, c)[0], 0.5, 1e-12);
}

TEST(Environments, RewardsAreExactChecks) {
  auto ar = make_environment("arithmetic");
  Task t = ar->task(1, 5);
  EXPECT_EQ(ar->task(1, 5).prompt, t.prompt);  // the same index, the same task
  EXPECT_EQ(ar->reward(t, t.answer), 1.0);
  EXPECT_EQ(ar->reward(t, "The answer is " + t.answer + "."), 1.0);
  EXPECT_EQ(ar->reward(t, t.answer + "1"), 0.0);
  EXPECT_EQ(ar->reward(t, "\xff\xfe garbage"), 0.0);
  auto rv = make_environment("reverse");
  t = rv->task(1, 2);
  EXPECT_EQ(rv->reward(t, " " + t.answer + "\n"), 1.0);
  EXPECT_EQ(rv->reward(t, t.prompt), 0.0);
  auto cd = make_environment("countdown");
  Task c;
  c.numbers = {3, 5, 7};
  c.answer = "22";
  EXPECT_EQ(cd->reward(c, "3 * 5 + 7"), 1.0);
  EXPECT_EQ(cd->reward(c, "(7 + 5) * 3 - 14"), 0.0);  // 14 is not one of the numbers
  EXPECT_EQ(cd->reward(c, "5 * 5 - 3"), 0.0);         // 5 used twice
  EXPECT_EQ(cd->reward(c, "22"), 0.0);
  EXPECT_EQ(cd->reward(c, std::string(100, '(') + "3" + std::string(100, ')')), 0.0);
  long long v = 0;
  EXPECT_TRUE(eval_countdown("(3 + 5) * 7", {3, 5, 7}, &v));
  EXPECT_EQ(v, 56);
  // Every generated countdown task is solvable by construction.
  for (uint64_t i = 0; i < 20; ++i) EXPECT_GT(std::stoll(cd->task(9, i).answer), 0);
  EXPECT_THROW(make_environment("chess"), Error);
}

TEST(GrpoTrainer, RaisesTheRewardOfATinyModel) {
  Decoder m(rltest::tiny_config(), cpu_backend());
  m.params().init(3);
  auto tok = data::byte_chatml_tokenizer();
  data::ChatTemplate chat("chatml", tok);
  rltest::LetterA env;
  RlOptions o;
  o.prompts_per_step = 4;
  o.group_size = 8;
  o.max_tokens = 6;
  o.lr = 1e-2;
  o.grpo.beta = 0.01;
  GrpoTrainer t(m, tok, chat, env, o);
  double first = 0, last = 0, h_first = 0, h_last = 0;
  for (int s = 0; s < 30; ++s) {
    const RlStepStats st = t.step();
    EXPECT_TRUE(std::isfinite(st.loss));
    EXPECT_EQ(st.groups, 4);
    // A distribution over the 260 ids has entropy in [0, log 260].
    EXPECT_GE(st.entropy, 0.0);
    EXPECT_LE(st.entropy, std::log(260.0) + 1e-9);
    if (s == 0) {
      h_first = st.entropy;
      // A random model with small weights is close to uniform over its vocabulary.
      EXPECT_GT(st.entropy, 0.9 * std::log(260.0)) << "step 0";
    }
    if (st.train_tokens > 0) h_last = st.entropy;
    if (s < 5) first += st.reward_mean / 5;
    if (s >= 25) last += st.reward_mean / 5;
  }
  EXPECT_GT(last, first + 0.2) << "reward " << first << " -> " << last;
  std::printf("reward %.3f -> %.3f, entropy %.3f -> %.3f nats\n", first, last, h_first, h_last);
  // Learning to say "a" concentrates the policy: its entropy falls.
  EXPECT_LT(h_last, h_first - 0.5) << "entropy " << h_first << " -> " << h_last;
}

// The learner's logit pass in pieces (a few sequences at a time, as a large vocabulary needs)
// gives the one-pass step: the same loss, KL, entropy and gradient norm up to rounding, and the
// same weights after the step.
TEST(GrpoLearner, LogitPassInPiecesIsTheOnePassStep) {
  rltest::Fixture a, b;
  RlOptions o = rltest::small_options();  // beta > 0: the reference's pass is split too
  RolloutWorker w(a.model, a.tok, a.chat, a.env, o);
  const RolloutBatch rb = w.generate(0, 0);
  ASSERT_FALSE(rb.groups.empty());
  RlOptions pieces = o;
  pieces.logit_rows = 3;  // at most 3 rows a pass (a longer sequence still goes whole)
  GrpoLearner one(a.model, o), split(b.model, pieces);
  RlStepStats x, y;
  // Two steps on the same groups: the second sees them one step old (importance weights) and a
  // policy away from the reference (KL > 0).
  one.learn(rb.groups, 0, &x);
  split.learn(rb.groups, 0, &y);
  EXPECT_NEAR(x.entropy, y.entropy, 1e-6 * x.entropy);
  x = y = RlStepStats{};
  one.learn(rb.groups, 1, &x);
  split.learn(rb.groups, 1, &y);
  EXPECT_GT(x.kl, 0.0);
  EXPECT_NE(x.is_weight_mean, 1.0);
  ASSERT_GT(x.train_tokens, 3) << "one pass would do: nothing split";
  EXPECT_EQ(x.train_tokens, y.train_tokens);
  EXPECT_NEAR(x.loss, y.loss, 1e-6 * (1 + std::abs(x.loss)));
  EXPECT_NEAR(x.kl, y.kl, 1e-6 * x.kl);
  EXPECT_NEAR(x.is_weight_mean, y.is_weight_mean, 1e-7);
  EXPECT_NEAR(x.entropy, y.entropy, 1e-6 * x.entropy);
  EXPECT_NEAR(x.grad_norm, y.grad_norm, 1e-5 * x.grad_norm);
  double diff = 0;
  for (int64_t i = 0; i < a.model.params().total(); ++i)
    diff =
        std::max(diff, double(std::abs(a.model.params().data()[i] - b.model.params().data()[i])));
  EXPECT_LT(diff, 1e-4) << "the weights after the step differ by " << diff;
  std::printf("logit pass in pieces: weights differ by at most %.3g, loss %.9g vs %.9g\n", diff,
              x.loss, y.loss);
}

// Rollouts sampled at temperature T record the log-probs of softmax(z / T), z the policy's
// logits (recomputed here from forward_logits at scale 1, in double), and the learner takes the
// same ones: on groups one version old and the weights unchanged, every importance weight
// exp(logp_learner - logp_behaviour) is 1 to rounding.
TEST(GrpoLearner, LogprobsAreThoseOfTheSamplingTemperature) {
  ModelConfig c = rltest::tiny_config();
  c.init_std = 0.3f;  // logits far from uniform: temperature 0.5 and 1 give other log-probs
  rltest::Fixture a(c);
  RlOptions o = rltest::small_options();
  o.temperature = 0.5f;
  RolloutWorker w(a.model, a.tok, a.chat, a.env, o);
  const RolloutBatch rb = w.generate(0, 0);
  ASSERT_FALSE(rb.groups.empty());
  const int V = a.model.config().vocab;
  int64_t checked = 0;
  double apart = 0;  // how far the temperature-1 log-probs lie from them
  for (const PromptGroup& g : rb.groups)
    for (const Rollout& r : g.rollouts) {
      std::vector<int32_t> seq = g.prompt;
      seq.insert(seq.end(), r.response.begin(), r.response.end());
      std::vector<int32_t> pos(seq.size()), cu = {0, int32_t(seq.size())};
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
      ModelInput in{seq.data(), nullptr, pos.data(), cu.data(), int(seq.size()), 1};
      std::vector<int> rows;
      for (size_t t = 0; t < r.response.size(); ++t) rows.push_back(int(g.prompt.size() + t) - 1);
      std::vector<float> z(rows.size() * size_t(V));
      a.model.forward_logits(in, rows, z.data());
      ASSERT_EQ(r.logprobs.size(), r.response.size());
      for (size_t t = 0; t < rows.size(); ++t) {
        const float* x = z.data() + t * size_t(V);
        double mx = -1e300, sum = 0;
        for (int j = 0; j < V; ++j) mx = std::max(mx, double(x[j]) / 0.5);
        for (int j = 0; j < V; ++j) sum += std::exp(double(x[j]) / 0.5 - mx);
        const double want = double(x[r.response[t]]) / 0.5 - mx - std::log(sum);
        EXPECT_NEAR(r.logprobs[t], want, 1e-4) << "token " << t;
        double mx1 = -1e300, sum1 = 0;
        for (int j = 0; j < V; ++j) mx1 = std::max(mx1, double(x[j]));
        for (int j = 0; j < V; ++j) sum1 += std::exp(double(x[j]) - mx1);
        apart += std::fabs(double(x[r.response[t]]) - mx1 - std::log(sum1) - want);
        ++checked;
      }
    }
  EXPECT_GT(checked, 10);
  EXPECT_GT(apart / double(checked), 0.05) << "the temperature does not matter to this model";
  GrpoLearner learner(a.model, o);
  RlStepStats st;
  learner.learn(rb.groups, 1, &st);  // version 1 > the groups' 0: importance-weighted
  ASSERT_GT(st.train_tokens, 0);
  EXPECT_NEAR(st.is_weight_mean, 1.0, 1e-4);
}

// Bad input for tensor-parallel learners (--learner-tp): a learner count the TP size does not
// divide, and a model whose heads (or width, or vocabulary) do not split, are refused with the
// numbers named; a grid that splits is accepted.
TEST(LearnerGrid, RefusesLayoutsThatDoNotSplit) {
  const ModelConfig c = rltest::tiny_config();  // 4 heads, 2 KV heads, d_ff 64, vocab 260
  EXPECT_NO_THROW(check_learner_grid(1, 1, c));
  EXPECT_NO_THROW(check_learner_grid(2, 2, c));
  EXPECT_NO_THROW(check_learner_grid(4, 2, c));
  auto message = [](int learners, int tp, const ModelConfig& cfg) {
    try {
      check_learner_grid(learners, tp, cfg);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(3, 2, c).find("--learner-tp 2 must divide the 3 learner rank(s)"),
            std::string::npos)
      << message(3, 2, c);
  EXPECT_NE(message(1, 2, c).find("must divide the 1 learner"), std::string::npos);
  EXPECT_NE(message(2, 0, c).find("--learner-tp must be at least 1"), std::string::npos);
  ModelConfig heads = c;
  heads.n_head = 3, heads.n_kv_head = 1, heads.head_dim = 8;
  EXPECT_NE(message(2, 2, heads).find("model.n_head (3) must be divisible"), std::string::npos)
      << message(2, 2, heads);
  ModelConfig kv = c;
  kv.n_kv_head = 1;
  EXPECT_NE(message(2, 2, kv).find("model.n_kv_head (1)"), std::string::npos) << message(2, 2, kv);
  ModelConfig vocab = c;
  vocab.vocab = 259;
  EXPECT_NE(message(2, 2, vocab).find("model.vocab (259)"), std::string::npos);
  // Sequence parallelism needs a TP group; a MoE policy trains under TP, and under SP only
  // without the auxiliary loss and capacity that SP's padding tokens would change.
  auto sp_message = [](int tp, const ModelConfig& cfg) {
    try {
      check_learner_grid(2, tp, cfg, true);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(sp_message(1, c).find("--learner-sp needs --learner-tp > 1"), std::string::npos);
  EXPECT_NO_THROW(check_learner_grid(2, 2, c, true));
  ModelConfig moe = rltest::tiny_moe_config();
  EXPECT_NO_THROW(check_learner_grid(2, 2, moe));
  EXPECT_NE(sp_message(2, moe).find("model.aux_loss_coeff = 0"), std::string::npos)
      << sp_message(2, moe);
  moe.aux_loss_coeff = 0;
  EXPECT_NO_THROW(check_learner_grid(2, 2, moe, true));
  moe.capacity_factor = 1.25;
  EXPECT_NE(sp_message(2, moe).find("dropless routing"), std::string::npos);
}

// Bad input for expert-parallel learners (--learner-ep, --learner-etp): a dense policy, an EP
// size that does not divide the data-parallel groups or the experts, an ETP size that does not
// divide the TP group or the experts' width: refused with the numbers named.
TEST(LearnerGrid, RefusesExpertLayoutsThatDoNotSplit) {
  const ModelConfig dense = rltest::tiny_config();
  const ModelConfig moe = rltest::tiny_moe_config();  // 4 experts, d_ff 64
  EXPECT_NO_THROW(check_learner_grid(2, 1, moe, false, 2));
  EXPECT_NO_THROW(check_learner_grid(4, 2, moe, false, 2, 2));
  EXPECT_NO_THROW(check_learner_grid(8, 2, moe, false, 4, 1));
  auto message = [](int learners, int tp, const ModelConfig& cfg, int ep, int etp) {
    try {
      check_learner_grid(learners, tp, cfg, false, ep, etp);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(2, 1, dense, 2, 1).find("this one has none (model.n_experts = 0)"),
            std::string::npos)
      << message(2, 1, dense, 2, 1);
  EXPECT_NE(message(2, 2, dense, 1, 2).find("--learner-etp 2 split the experts"), std::string::npos)
      << message(2, 2, dense, 1, 2);
  EXPECT_NE(message(3, 1, moe, 2, 1).find("--learner-ep 2 must divide the 3 data-parallel"),
            std::string::npos)
      << message(3, 1, moe, 2, 1);
  EXPECT_NE(message(2, 2, moe, 2, 1).find("--learner-ep 2 must divide the 1 data-parallel"),
            std::string::npos)
      << message(2, 2, moe, 2, 1);
  EXPECT_NE(message(3, 1, moe, 3, 1).find("model.n_experts (4) must be divisible"),
            std::string::npos)
      << message(3, 1, moe, 3, 1);
  EXPECT_NE(message(2, 1, moe, 1, 2).find("--learner-etp 2 must divide --learner-tp 1"),
            std::string::npos)
      << message(2, 1, moe, 1, 2);
  EXPECT_NE(message(3, 3, moe, 1, 3).find("--learner-etp 3: model.d_ff (64)"), std::string::npos)
      << message(3, 3, moe, 1, 3);
  EXPECT_NE(message(2, 1, moe, 0, 1).find("must be at least 1"), std::string::npos);
}
