// Speculative decoding: prompt lookup's proposals; the rejection rule's output follows the
// target's distribution (chi-square); the engine with n-gram guesses decodes greedily exactly as
// without them under every schedule of engine_replay.h (both families, many requests, preemption),
// frees every block, and its sampled tokens follow the target model's probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/rng.h"
#include "infer/draft_model.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "infer/speculative.h"
#include "model/decoder.h"

#include "engine_replay.h"
#include "infer_test_util.h"

using namespace loom;
using namespace loom::infer;
namespace rp = loom::infer::test;
using loom::infer::test::tiny;

namespace {

// The chi-square statistic's 0.999 quantile for `df` degrees of freedom (Wilson-Hilferty): a
// correct sampler exceeds it once in a thousand seeds.
double chi2_critical_999(int df) {
  const double z = 3.090, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Observed counts against expected probabilities: bins expected below 5 draws pooled into one.
// Returns {statistic, degrees of freedom}.
std::pair<double, int> chi_square(const std::map<std::vector<int32_t>, int>& seen,
                                  const std::map<std::vector<int32_t>, double>& prob, int draws) {
  double stat = 0, pooled_expect = 0;
  int pooled_seen = 0, bins = 0, counted = 0;
  for (const auto& [key, p] : prob) {
    const auto it = seen.find(key);
    const int o = it == seen.end() ? 0 : it->second;
    counted += o;
    const double e = p * draws;
    if (e < 5) {
      pooled_expect += e;
      pooled_seen += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++bins;
  }
  pooled_seen += draws - counted;  // outcomes given no probability at all
  if (pooled_expect > 0 || pooled_seen > 0) {
    const double e = std::max(pooled_expect, 1e-9);
    stat += (pooled_seen - e) * (pooled_seen - e) / e;
    ++bins;
  }
  return {stat, bins - 1};
}

SpeculativeConfig ngram(int k) {
  SpeculativeConfig c;
  c.method = SpeculativeMethod::Ngram;
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = 1;
  c.prompt_lookup_max = 3;
  return c;
}

// Softmax of the model's last-position logits for `seq`, at temperature 1.
std::vector<double> next_token_probs(Decoder& m, const std::vector<int32_t>& seq) {
  std::vector<float> logits(size_t(m.config().vocab));
  std::vector<int32_t> pos(seq.size()), cu = {0, int32_t(seq.size())};
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  ModelInput in{seq.data(), nullptr, pos.data(), cu.data(), int(seq.size()), 1};
  m.forward_logits(in, {int(seq.size()) - 1}, logits.data());
  double mx = logits[0], z = 0;
  for (float x : logits) mx = std::max(mx, double(x));
  std::vector<double> p(logits.size());
  for (size_t j = 0; j < p.size(); ++j) z += p[j] = std::exp(logits[j] - mx);
  for (double& x : p) x /= z;
  return p;
}

// A model whose next token depends on the last one only: p(b | a) = softmax(table[a])[b], with
// b = a + 1 (mod 4) the likeliest, so that prompt lookup on 0 1 2 3 0 1 ... guesses right
// about half the time and wrong the rest. Scores every row asked for.
struct MarkovRunner : ModelRunner {
  static constexpr int kVocab = 8;
  float table[kVocab][kVocab];
  MarkovRunner() {
    for (int a = 0; a < kVocab; ++a)
      for (int b = 0; b < kVocab; ++b)
        table[a][b] =
            2.f * uniform_at(4, uint64_t(a), uint64_t(b)) + (b == (a + 1) % 4 ? 2.f : 0.f);
  }
  int vocab() const override { return kVocab; }
  int max_seq() const override { return 64; }
  KvSpec kv_spec() const override { return {1, 1, 4, DType::F32}; }
  bool scores_many_rows() const override { return true; }
  void forward(const std::vector<SeqChunk>& batch, const KvCacheView&, float* logits) override {
    for (const SeqChunk& c : batch) {
      if (!c.want_logits) continue;
      for (int r = c.n - c.logits_rows; r < c.n; ++r, logits += kVocab)
        std::copy(table[c.tokens[r]], table[c.tokens[r]] + kVocab, logits);
    }
  }
  std::vector<double> probs(int32_t a) const {
    std::vector<double> p(kVocab);
    double mx = *std::max_element(table[a], table[a] + kVocab), z = 0;
    for (int b = 0; b < kVocab; ++b) z += p[size_t(b)] = std::exp(table[a][b] - mx);
    for (double& x : p) x /= z;
    return p;
  }
};

// The first `len` tokens of `draws` seeded completions of `prompt` at temperature 1 with n-gram
// guesses (k = 3), counted per text; the guesses kept and replaced from their usage.
struct SampledTexts {
  std::map<std::vector<int32_t>, int> seen;
  int64_t accepted = 0, rejected = 0;
  EngineStats stats;
  int blocks_left_used = -1;
};
SampledTexts sample_texts(ModelRunner& runner, const std::vector<int32_t>& prompt, int len,
                          int draws, ModelRunner* draft = nullptr) {
  EngineConfig ec;
  ec.speculative = ngram(3);
  if (draft) ec.speculative.method = SpeculativeMethod::Draft;
  ec.max_queue = 1 << 20;
  LoomEngine e(runner, ec, draft);
  std::map<int64_t, std::vector<int32_t>> out;
  SampledTexts r;
  SamplingParams sp;
  sp.temperature = 1, sp.max_tokens = len, sp.ignore_eos = true;
  for (int i = 0; i < draws; ++i) {
    sp.seed = uint64_t(1000 + i);
    e.submit(prompt, sp, [&](const TokenEvent& ev) {
      auto& t = out[ev.request_id];
      t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        r.accepted += ev.usage.accepted_draft_tokens;
        r.rejected += ev.usage.rejected_draft_tokens;
      }
    });
  }
  e.run_until_idle();
  for (const auto& [id, t] : out) ++r.seen[t];
  r.stats = e.stats();
  r.blocks_left_used = e.cache().num_used();
  if (e.draft()) r.blocks_left_used += e.draft()->cache().num_used();
  return r;
}

// The exact joint probabilities of the first three tokens after `prompt`, at temperature 1.
std::map<std::vector<int32_t>, double> joint_of_three(Decoder& m,
                                                      const std::vector<int32_t>& prompt) {
  const int V = m.config().vocab;
  std::map<std::vector<int32_t>, double> prob;
  const std::vector<double> p1 = next_token_probs(m, prompt);
  for (int32_t a = 0; a < V; ++a) {
    std::vector<int32_t> s1 = prompt;
    s1.push_back(a);
    const std::vector<double> p2 = next_token_probs(m, s1);
    for (int32_t b = 0; b < V; ++b) {
      std::vector<int32_t> s2 = s1;
      s2.push_back(b);
      const std::vector<double> p3 = next_token_probs(m, s2);
      for (int32_t c = 0; c < V; ++c)
        prob[{a, b, c}] = p1[size_t(a)] * p2[size_t(b)] * p3[size_t(c)];
    }
  }
  return prob;
}

SpeculativeConfig draft_method(int k) {
  SpeculativeConfig c;
  c.method = SpeculativeMethod::Draft;
  c.num_speculative_tokens = k;
  return c;
}

}  // namespace

TEST(Speculative, NgramSampledTokensFollowAMarkovModelsProbabilities) {
  MarkovRunner runner;
  const std::vector<int32_t> prompt = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2};
  const int V = MarkovRunner::kVocab, draws = 20000;
  std::map<std::vector<int32_t>, double> prob;
  for (int32_t a = 0; a < V; ++a)
    for (int32_t b = 0; b < V; ++b)
      for (int32_t c = 0; c < V; ++c)
        prob[{a, b, c}] = runner.probs(prompt.back())[size_t(a)] * runner.probs(a)[size_t(b)] *
                          runner.probs(b)[size_t(c)];
  const SampledTexts got = sample_texts(runner, prompt, 3, draws);
  const auto [stat, df] = chi_square(got.seen, prob, draws);
  EXPECT_LT(stat, chi2_critical_999(df)) << "df " << df;
  EXPECT_GT(df, 30);
  // Guesses both kept and replaced often (the test scores rows after kept guesses).
  EXPECT_GT(got.accepted, draws / 4);
  EXPECT_GT(got.rejected, draws / 4);
  EXPECT_EQ(got.stats.spec_accepted_tokens_total, got.accepted);
  EXPECT_EQ(got.stats.spec_draft_tokens_total, got.accepted + got.rejected);
  EXPECT_EQ(got.blocks_left_used, 0);
}

TEST(Speculative, NgramProposesWhatFollowedTheLatestLongestMatch) {
  // ... 1 2 3 9 ... 1 2 3 7 8 ... 1 2 3: the longest suffix (3 tokens) last occurred before 7 8.
  const std::vector<int32_t> t = {1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 6, 1, 2, 3};
  EXPECT_EQ(ngram_propose(t, 1, 3, 2), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(ngram_propose(t, 1, 3, 10), (std::vector<int32_t>{7, 8, 6, 1, 2, 3}));
  // No earlier occurrence of the last token: nothing to propose.
  EXPECT_TRUE(ngram_propose({4, 5, 6}, 1, 3, 4).empty());
  // Only a shorter match: falls back to it (last token 5 followed 5 before).
  EXPECT_EQ(ngram_propose({5, 6, 9, 5}, 1, 3, 2), (std::vector<int32_t>{6, 9}));
  // min_n above any match length: nothing.
  EXPECT_TRUE(ngram_propose({5, 6, 9, 5}, 2, 3, 2).empty());
}

TEST(Speculative, ConfigurationErrorsNameTheField) {
  SpeculativeConfig c = ngram(0);
  EXPECT_THROW(validate(c), Error);
  c = ngram(4);
  c.prompt_lookup_min = 3, c.prompt_lookup_max = 2;
  try {
    validate(c);
    FAIL() << "max < min accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt_lookup_max"), std::string::npos) << e.what();
  }
  EXPECT_THROW(speculative_method_from_name("medusa"), Error);
  EXPECT_EQ(speculative_method_from_name("ngram"), SpeculativeMethod::Ngram);
}

// Guesses drawn from q, kept with probability min(1, p/q), else replaced from the residual: the
// tokens that come out are distributed as p (chi-square at the 0.999 quantile), and the guess is
// kept at the rate sum_j min(p_j, q_j).
TEST(Speculative, RejectionSamplingFollowsTheTargetDistribution) {
  const std::vector<double> p = {0.05, 0.30, 0.10, 0.25, 0.20, 0.10};
  const std::vector<double> q = {0.40, 0.05, 0.20, 0.05, 0.10, 0.20};
  const int draws = 200000;
  std::map<std::vector<int32_t>, int> seen;
  std::map<std::vector<int32_t>, double> prob;
  for (size_t j = 0; j < p.size(); ++j) prob[{int32_t(j)}] = p[j];
  int kept = 0;
  for (int i = 0; i < draws; ++i) {
    double u = uniform_at(11, 1, uint64_t(i));
    int32_t d = 0;
    while (d + 1 < int32_t(q.size()) && (u -= q[size_t(d)]) >= 0) ++d;
    bool accepted = false;
    const int32_t t = speculative_verify(p, q, d, uniform_at(11, 2, uint64_t(i)),
                                         uniform_at(11, 3, uint64_t(i)), accepted);
    kept += accepted;
    ++seen[{t}];
  }
  const auto [stat, df] = chi_square(seen, prob, draws);
  EXPECT_LT(stat, chi2_critical_999(df)) << "df " << df;
  double overlap = 0;
  for (size_t j = 0; j < p.size(); ++j) overlap += std::min(p[j], q[j]);
  EXPECT_NEAR(double(kept) / draws, overlap, 0.01);
  // q one-hot (prompt lookup): kept with probability p(d), never otherwise returned.
  std::vector<double> one_hot(p.size(), 0.0);
  one_hot[1] = 1;
  bool acc = true;
  EXPECT_NE(speculative_verify(p, one_hot, 1, 0.5, 0.3, acc), 1);
  EXPECT_FALSE(acc);
  EXPECT_EQ(speculative_verify(p, one_hot, 1, 0.2, 0.3, acc), 1);
  EXPECT_TRUE(acc);
}

// Greedy with n-gram guesses equals greedy without them, token for token and logprob for logprob
// (each guess's row scored in the verification pass), under every schedule of the engine tests:
// many requests at once, prefix hits, small prefill chunks, no chunking, and a pool so small that
// sequences are preempted. Guesses were made, some kept and some rejected (their blocks rolled
// back: every block is free at the end).
TEST(Speculative, NgramGreedyEqualsPlainDecodingUnderEverySchedule) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(2);  // weights whose greedy texts repeat some of their prompts
    int64_t drafted = 0, kept = 0;
    for (const rp::ReplaySetup& s : rp::replay_setups()) {
      const rp::Replay want = rp::replay(m, s);
      for (int k : {1, 4}) {
        const rp::Replay got = rp::replay(m, s, ngram(k));
        const std::string at =
            std::string(" (") + family_name(f) + ", " + s.name + ", k " + std::to_string(k) + ")";
        ASSERT_EQ(got.tokens.size(), want.tokens.size()) << at;
        for (size_t i = 0; i < want.tokens.size(); ++i) {
          EXPECT_EQ(got.tokens[i], want.tokens[i]) << "request " << i << at;
          ASSERT_EQ(got.logprobs[i].size(), want.logprobs[i].size()) << at;
          for (size_t j = 0; j < want.logprobs[i].size(); ++j)
            EXPECT_NEAR(got.logprobs[i][j], want.logprobs[i][j], 1e-4) << i << " " << j << at;
          EXPECT_EQ(got.finish_reasons[i], "length") << at;
        }
        EXPECT_EQ(got.blocks_left_used, 0) << at;
        drafted += got.draft_tokens;
        kept += got.accepted_tokens;
      }
    }
    EXPECT_GT(kept, 0) << family_name(f);
    EXPECT_LT(kept, drafted) << family_name(f);
  }
}

// Sampling at temperature 1 with n-gram guesses: the first three tokens of many seeded
// completions of a repetitive prompt (so that guesses are made and scored from the first decode
// on) follow the target model's exact joint probabilities, chi-square at the 0.999 quantile; the
// usage of the completions counts the guesses kept and replaced.
TEST(Speculative, NgramSampledTokensFollowTheTargetModel) {
  ModelConfig cfg = tiny(Family::Llama);
  cfg.vocab = 16, cfg.init_std = 0.3f;
  Decoder m(cfg, cpu_backend());
  m.params().init(3);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3};
  // Exact joint probabilities of (t1, t2, t3).
  std::map<std::vector<int32_t>, double> prob;
  const std::vector<double> p1 = next_token_probs(m, prompt);
  for (int32_t a = 0; a < cfg.vocab; ++a) {
    std::vector<int32_t> s1 = prompt;
    s1.push_back(a);
    const std::vector<double> p2 = next_token_probs(m, s1);
    for (int32_t b = 0; b < cfg.vocab; ++b) {
      std::vector<int32_t> s2 = s1;
      s2.push_back(b);
      const std::vector<double> p3 = next_token_probs(m, s2);
      for (int32_t c = 0; c < cfg.vocab; ++c)
        prob[{a, b, c}] = p1[size_t(a)] * p2[size_t(b)] * p3[size_t(c)];
    }
  }
  DecoderRunner runner(m);
  const int draws = 6000;
  const SampledTexts got = sample_texts(runner, prompt, 3, draws);
  const auto [stat, df] = chi_square(got.seen, prob, draws);
  EXPECT_LT(stat, chi2_critical_999(df)) << "df " << df;
  EXPECT_GT(df, 10);  // the test sees a spread distribution, not one likely text
  EXPECT_GT(got.accepted, 0);
  EXPECT_GT(got.rejected, 0);
  EXPECT_EQ(got.stats.spec_accepted_tokens_total, got.accepted);
  EXPECT_EQ(got.stats.spec_draft_tokens_total, got.accepted + got.rejected);
  EXPECT_EQ(got.blocks_left_used, 0);
}

// Greedy with a draft model's guesses equals greedy without them, token for token, under every
// schedule of the engine tests, for both families: with a one-layer draft of other weights
// (guesses often wrong) and with a copy of the target (guesses nearly always right). Every
// block of both pools is free at the end.
TEST(Speculative, DraftGreedyEqualsPlainDecodingUnderEverySchedule) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(2);
    ModelConfig small = tiny(f);
    small.n_layer = 1;
    Decoder other(small, cpu_backend());
    other.params().init(7);
    Decoder copy(tiny(f), cpu_backend());
    copy.params().init(2);
    for (const rp::ReplaySetup& s : rp::replay_setups()) {
      const rp::Replay want = rp::replay(m, s);
      for (Decoder* d : {&other, &copy}) {
        const rp::Replay got =
            rp::replay(m, s, draft_method(d == &copy ? 4 : 2), KvCacheDtype::Auto, d);
        const std::string at = std::string(" (") + family_name(f) + ", " + s.name + ", " +
                               (d == &copy ? "copy" : "one-layer") + " draft)";
        ASSERT_EQ(got.tokens.size(), want.tokens.size()) << at;
        for (size_t i = 0; i < want.tokens.size(); ++i) {
          EXPECT_EQ(got.tokens[i], want.tokens[i]) << "request " << i << at;
          ASSERT_EQ(got.logprobs[i].size(), want.logprobs[i].size()) << at;
          for (size_t j = 0; j < want.logprobs[i].size(); ++j)
            EXPECT_NEAR(got.logprobs[i][j], want.logprobs[i][j], 1e-4) << i << " " << j << at;
        }
        EXPECT_EQ(got.blocks_left_used, 0) << at;
        EXPECT_EQ(got.draft_blocks_left_used, 0) << at;
        EXPECT_GT(got.draft_tokens, 0) << at;
        if (d == &copy) {
          EXPECT_GT(got.accepted_tokens, got.draft_tokens * 9 / 10) << at;
        } else {
          EXPECT_LT(got.accepted_tokens, got.draft_tokens) << at;
        }
      }
    }
  }
}

// Sampling at temperature 1 with a one-layer draft (the target's first layer, embedding and
// head, by the seeded init): the first three tokens of many seeded completions follow the
// target model's exact joint probabilities (chi-square at the 0.999 quantile); guesses were
// both kept and replaced.
TEST(Speculative, DraftSampledTokensFollowTheTargetModel) {
  ModelConfig cfg = tiny(Family::Llama);
  cfg.vocab = 16, cfg.init_std = 0.3f;
  Decoder m(cfg, cpu_backend());
  m.params().init(3);
  ModelConfig small = cfg;
  small.n_layer = 1;
  Decoder d(small, cpu_backend());
  d.params().init(3);  // the target's first layer, embedding and head: a related draft
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  const auto prob = joint_of_three(m, prompt);
  DecoderRunner runner(m), draft(d);
  const int draws = 6000;
  const SampledTexts got = sample_texts(runner, prompt, 3, draws, &draft);
  const auto [stat, df] = chi_square(got.seen, prob, draws);
  EXPECT_LT(stat, chi2_critical_999(df)) << "df " << df;
  EXPECT_GT(df, 10);
  EXPECT_GT(got.accepted, draws / 10);
  EXPECT_GT(got.rejected, draws / 10);
  EXPECT_EQ(got.stats.spec_accepted_tokens_total, got.accepted);
  EXPECT_EQ(got.stats.spec_draft_tokens_total, got.accepted + got.rejected);
  EXPECT_EQ(got.blocks_left_used, 0);
}

TEST(Speculative, ADraftOfAnotherVocabularyIsRefused) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  ModelConfig c = tiny(Family::GPT2);
  c.vocab = 80;
  Decoder d(c, cpu_backend());
  DecoderRunner runner(m), draft(d);
  EngineConfig ec;
  ec.speculative = draft_method(3);
  try {
    LoomEngine e(runner, ec, &draft);
    FAIL() << "a draft of 80 tokens for a target of 64 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary (80 tokens)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LoomEngine(runner, ec), Error);  // draft without a draft model
  EXPECT_EQ(speculative_method_from_name("draft"), SpeculativeMethod::Draft);
}

// The draft model alone: its guesses are its greedy continuation (the no-cache forward's), after
// a partly kept proposal too (what it computed for the kept prefix is reused), and when its pool
// is too small for every sequence the states it did not serve give their blocks back, after
// which a sequence is computed from the start again with the same guesses.
TEST(Speculative, DraftProposesItsGreedyContinuationWithinASmallPool) {
  Decoder d(tiny(Family::GPT2), cpu_backend());
  d.params().init(5);
  DecoderRunner runner(d);
  DraftModel dm(runner, 8, 6);  // 48 positions
  auto greedy = [&](std::vector<int32_t> t, int n) {
    SamplingOptions o;
    o.temperature = 0;
    const size_t from = t.size();
    generate(d, t, n, o);
    return std::vector<int32_t>(t.begin() + long(from), t.end());
  };
  auto propose = [&](int64_t id, const std::vector<int32_t>& t, int k) {
    std::vector<DraftModel::Job> jobs(1);
    jobs[0].seq = id, jobs[0].tokens = &t, jobs[0].k = k;
    dm.propose(jobs);
    return jobs[0].guesses;
  };
  std::vector<int32_t> a = infer::test::prompt(10, 1), b = infer::test::prompt(12, 2);
  EXPECT_EQ(propose(1, a, 4), greedy(a, 4));
  EXPECT_EQ(propose(2, b, 4), greedy(b, 4));
  // Two guesses kept, then a token of the target's own.
  const std::vector<int32_t> ga = greedy(a, 2);
  a.insert(a.end(), ga.begin(), ga.end());
  a.push_back((greedy(a, 1)[0] + 1) % 64);
  EXPECT_EQ(propose(1, a, 3), greedy(a, 3));
  // 34 positions need 5 of the 6 blocks: a and b give theirs back.
  const std::vector<int32_t> c = infer::test::prompt(30, 3);
  EXPECT_EQ(propose(3, c, 5), greedy(c, 5));
  EXPECT_EQ(dm.cache().num_used(), 5);
  // c now holds 5 blocks and is not served: b takes them back and starts over.
  EXPECT_EQ(propose(2, b, 4), greedy(b, 4));
  // More positions than the whole pool: no guesses, no failure.
  EXPECT_TRUE(propose(4, infer::test::prompt(60, 4), 4).empty());
  for (int64_t id : {1, 2, 3, 4}) dm.forget(id);
  EXPECT_EQ(dm.cache().num_used(), 0);
}
