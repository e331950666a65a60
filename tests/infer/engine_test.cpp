// The serving engine with the real Decoder: greedy output equals the no-cache forward's greedy
// output token for token (both families, shared prefixes, chunked prefill on and off, a pool so
// small it forces preemption, one or many requests at once: the schedules of engine_replay.h);
// logprobs equal the full forward's log-softmax; seeds reproduce across batch compositions; stops,
// cancellation, errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <map>

#include "core/rng.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "model/decoder.h"

#include "engine_replay.h"
#include "infer_test_util.h"

using namespace loom;
using namespace loom::infer;
namespace rp = loom::infer::test;
using loom::infer::test::greedy;
using loom::infer::test::prompt;
using loom::infer::test::seeded_completions;
using loom::infer::test::tiny;

namespace {

// The reference: re-run the whole sequence for every token (no cache), greedy.
std::vector<int32_t> no_cache_greedy(Decoder& m, std::vector<int32_t> p, int n) {
  SamplingOptions o;
  o.temperature = 0;
  const size_t before = p.size();
  generate(m, p, n, o);
  return std::vector<int32_t>(p.begin() + long(before), p.end());
}

struct Collected {
  std::map<int64_t, std::map<int, std::vector<int32_t>>> tokens;
  std::map<int64_t, std::map<int, std::vector<float>>> logprobs;
  std::map<int64_t, std::map<int, std::string>> reason;
  std::map<int64_t, std::map<int, Usage>> usage;
  std::function<void(const TokenEvent&)> sink() {
    return [this](const TokenEvent& e) {
      auto& t = tokens[e.request_id][e.index];
      t.insert(t.end(), e.tokens.begin(), e.tokens.end());
      auto& l = logprobs[e.request_id][e.index];
      l.insert(l.end(), e.logprobs.begin(), e.logprobs.end());
      if (e.finished) {
        reason[e.request_id][e.index] = e.finish_reason;
        usage[e.request_id][e.index] = e.usage;
      }
    };
  }
};

}  // namespace

TEST(Engine, GreedyEqualsNoCacheForwardUnderEverySchedule) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(5);
    std::vector<std::vector<int32_t>> want;
    for (auto& p : rp::replay_prompts()) want.push_back(no_cache_greedy(m, p, rp::kReplayTokens));
    for (const rp::ReplaySetup& s : rp::replay_setups()) {
      const rp::Replay got = rp::replay(m, s);
      ASSERT_EQ(got.tokens.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got.tokens[i], want[i]) << family_name(f) << ", " << s.name << ", " << i;
        EXPECT_EQ(got.finish_reasons[i], "length");
      }
      if (std::string(s.name) == "preemption") {
        EXPECT_GT(got.preemptions, 0);
      }
      if (std::string(s.name) == "one at a time") {  // later prompts found the shared prefix
        EXPECT_EQ(got.cached_prompt_tokens[2], 16);
      }
      EXPECT_EQ(got.blocks_left_used, 0);  // every block back
    }
  }
}

// Gemma's options through the paged cache (paged_attention_variant): windows of 5 on every other
// layer (Gemma 2) or two of three (Gemma 3, with q/k norms and a local RoPE base), soft-capped
// scores and logits; prompts and completions run well past the window.
TEST(Engine, GemmaWindowsAndCapsEqualNoCacheForwardUnderEverySchedule) {
  for (int variant = 0; variant < 2; ++variant) {
    ModelConfig c = tiny(Family::Llama);
    c.head_dim = 12;
    c.tied = true;
    c.geglu = true;
    c.embed_scale = true;
    c.sandwich_norm = true;
    c.sliding_window = 5;
    c.attn_scalar = 10.f;
    if (variant == 0) {
      c.window_pattern = 2;
      c.attn_softcap = 2.f;
      c.final_softcap = 5.f;
    } else {
      c.n_layer = 3;
      c.window_pattern = 3;
      c.qk_norm = true;
      c.rope_local_theta = 300.f;
    }
    Decoder m(c, cpu_backend());
    m.params().init(5);
    std::vector<std::vector<int32_t>> want;
    for (auto& p : rp::replay_prompts()) want.push_back(no_cache_greedy(m, p, rp::kReplayTokens));
    for (const rp::ReplaySetup& s : rp::replay_setups()) {
      const rp::Replay got = rp::replay(m, s);
      ASSERT_EQ(got.tokens.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(got.tokens[i], want[i]) << "gemma " << variant << ", " << s.name << ", " << i;
    }
  }
}

TEST(Engine, LogprobsAreTheFullForwardsLogSoftmax) {
  Decoder m(tiny(Family::Llama), cpu_backend());
  m.params().init(7);
  DecoderRunner runner(m);
  LoomEngine e(runner, EngineConfig{});
  SamplingParams p = greedy(6);
  p.logprobs = 3;
  std::vector<int32_t> seqv = prompt(10, 2);
  Collected got;
  const int64_t id = e.submit(seqv, p, got.sink());
  e.run_until_idle();
  const auto& toks = got.tokens[id][0];
  const auto& lps = got.logprobs[id][0];
  ASSERT_EQ(toks.size(), 6u);
  ASSERT_EQ(lps.size(), 6u);
  for (size_t k = 0; k < toks.size(); ++k) {
    std::vector<float> logits(64);
    std::vector<int32_t> pos(seqv.size()), cu = {0, int32_t(seqv.size())};
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
    ModelInput in{seqv.data(), nullptr, pos.data(), cu.data(), int(seqv.size()), 1};
    m.forward_logits(in, {int(seqv.size()) - 1}, logits.data());
    double mx = logits[0], z = 0;
    for (float x : logits) mx = std::max(mx, double(x));
    for (float x : logits) z += std::exp(x - mx);
    EXPECT_NEAR(lps[k], logits[size_t(toks[k])] - mx - std::log(z), 1e-4) << k;
    seqv.push_back(toks[k]);
  }
}

// logit_bias moves the draw (greedy included) but not the reported logprobs, which stay the
// raw logits' log-softmax; a bias of -100 takes the free greedy choice out.
TEST(Engine, LogitBiasSteersTheDrawNotTheLogprobs) {
  Decoder m(tiny(Family::Llama), cpu_backend());
  m.params().init(7);
  DecoderRunner runner(m);
  LoomEngine e(runner, EngineConfig{});
  const std::vector<int32_t> seqv = prompt(10, 2);
  SamplingParams p = greedy(4);
  p.logprobs = 0;
  Collected free_run, pushed, banned;
  const int64_t a = e.submit(seqv, p, free_run.sink());
  p.logit_bias = {{17, 100.f}};
  const int64_t b = e.submit(seqv, p, pushed.sink());
  e.run_until_idle();
  const int32_t first = free_run.tokens[a][0][0];
  ASSERT_NE(first, 17);
  EXPECT_EQ(pushed.tokens[b][0], std::vector<int32_t>(4, 17));
  std::vector<float> logits(64);
  std::vector<int32_t> pos(seqv.size()), cu = {0, int32_t(seqv.size())};
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  ModelInput in{seqv.data(), nullptr, pos.data(), cu.data(), int(seqv.size()), 1};
  m.forward_logits(in, {int(seqv.size()) - 1}, logits.data());
  double mx = logits[0], z = 0;
  for (float x : logits) mx = std::max(mx, double(x));
  for (float x : logits) z += std::exp(x - mx);
  EXPECT_NEAR(pushed.logprobs[b][0][0], logits[17] - mx - std::log(z), 1e-4);
  p.logit_bias = {{first, -100.f}};
  const int64_t c = e.submit(seqv, p, banned.sink());
  e.run_until_idle();
  EXPECT_NE(banned.tokens[c][0][0], first);
}

TEST(Engine, SeededSamplingIgnoresTheRestOfTheBatch) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(3);
  DecoderRunner runner(m);
  SamplingParams p;
  p.temperature = 1.0f, p.top_p = 0.9f, p.max_tokens = 10, p.seed = 42, p.ignore_eos = true;
  p.n = 2;
  SamplingParams q = p;
  q.seed.reset();
  const auto alone = seeded_completions(runner, p, q, 0),
             crowded = seeded_completions(runner, p, q, 3);
  EXPECT_EQ(alone.at(0), crowded.at(0));
  EXPECT_EQ(alone.at(1), crowded.at(1));
  EXPECT_NE(alone.at(0), alone.at(1));  // the n completions differ
}

TEST(Engine, StopsCancellationAndBadRequests) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(3);
  DecoderRunner runner(m);
  EngineConfig cfg;
  cfg.detokenize = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s += char('a' + t % 26);
    return s;
  };
  const auto p = prompt(6, 4);
  const auto free_run = no_cache_greedy(m, p, 10);
  // A stop token ends the completion without being part of it.
  {
    LoomEngine e(runner, cfg);
    SamplingParams s = greedy(10);
    s.stop_token_ids = {free_run[3]};
    Collected got;
    const int64_t id = e.submit(p, s, got.sink());
    e.run_until_idle();
    std::vector<int32_t> want(free_run.begin(), free_run.begin() + 3);
    auto first = std::find(free_run.begin(), free_run.end(), free_run[3]);
    want.assign(free_run.begin(), first);
    EXPECT_EQ(got.tokens[id][0], want);
    EXPECT_EQ(got.reason[id][0], "stop");
  }
  // A stop string cuts the text before it.
  {
    LoomEngine e(runner, cfg);
    SamplingParams s = greedy(10);
    std::string text = cfg.detokenize(free_run);
    s.stop = {text.substr(4, 2)};
    std::string streamed;
    bool done = false;
    e.submit(p, s, [&](const TokenEvent& ev) {
      streamed += ev.text;
      if (ev.finished) {
        done = true;
        EXPECT_EQ(ev.finish_reason, "stop");
      }
    });
    e.run_until_idle();
    EXPECT_TRUE(done);
    EXPECT_EQ(streamed, text.substr(0, text.find(s.stop[0])));
  }
  // Cancellation frees the blocks at once and delivers "abort".
  {
    LoomEngine e(runner, cfg);
    Collected got;
    const int64_t id = e.submit(p, greedy(50), got.sink());
    e.step();
    e.step();
    EXPECT_GT(e.cache().num_used(), 0);
    e.cancel(id);
    e.run_until_idle();
    EXPECT_EQ(got.reason[id][0], "abort");
    EXPECT_EQ(e.cache().num_used(), 0);
  }
  // Requests that can never run are refused with 400; a full queue with 429.
  {
    EngineConfig small = cfg;
    small.max_queue = 1;
    LoomEngine e(runner, small);
    auto status = [&](std::vector<int32_t> pr, SamplingParams s) {
      try {
        e.submit(std::move(pr), s, {});
        return 200;
      } catch (const RequestRejected& r) {
        return r.http_status;
      }
    };
    EXPECT_EQ(status(prompt(90, 1), greedy(10)), 400);  // beyond max_seq
    EXPECT_EQ(status({}, greedy(1)), 400);
    EXPECT_EQ(status({64}, greedy(1)), 400);  // outside the vocabulary
    SamplingParams bad = greedy(1);
    bad.top_p = 0;
    EXPECT_EQ(status(p, bad), 400);
    SamplingParams biased = greedy(1);
    biased.logit_bias = {{64, 1.f}};  // outside the vocabulary
    EXPECT_EQ(status(p, biased), 400);
    biased.logit_bias = {{3, 101.f}};
    EXPECT_EQ(status(p, biased), 400);
    EXPECT_EQ(status(p, greedy(5)), 200);
    EXPECT_EQ(status(p, greedy(5)), 429);
  }
}

TEST(Engine, ThreadedEngineServesConcurrentSubmitters) {
  Decoder m(tiny(Family::Llama), cpu_backend());
  m.params().init(11);
  DecoderRunner runner(m);
  const auto p = prompt(12, 8);
  const auto want = no_cache_greedy(m, p, 8);
  LoomEngine e(runner, EngineConfig{});
  e.start();
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::vector<int32_t>> outs(6);
  for (int i = 0; i < 6; ++i)
    e.submit(p, greedy(8), [&, i](const TokenEvent& ev) {
      std::lock_guard<std::mutex> l(mu);
      outs[size_t(i)].insert(outs[size_t(i)].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        ++done;
        cv.notify_all();
      }
    });
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(30), [&] { return done == 6; }));
  }
  e.stop(1.0);
  for (auto& o : outs) EXPECT_EQ(o, want);
}

// The engine's own thread runs its steps with the OpenMP thread count of the thread that
// started it (OpenMP's count is per thread; a new one would start from the default).
TEST(Engine, ThreadedEngineKeepsTheStartersThreadCount) {
  struct Recorder : ModelRunner {
    DecoderRunner inner;
    std::vector<int> seen;  // omp_get_max_threads() in each forward
    explicit Recorder(Decoder& m) : inner(m) {}
    int vocab() const override { return inner.vocab(); }
    int max_seq() const override { return inner.max_seq(); }
    KvSpec kv_spec() const override { return inner.kv_spec(); }
    void forward(const std::vector<SeqChunk>& b, const KvCacheView& c, float* l) override {
      seen.push_back(omp_get_max_threads());
      inner.forward(b, c, l);
    }
  };
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(3);
  const int before = omp_get_max_threads();
  // A count the default is not (the default is every core, or OMP_NUM_THREADS).
  const int want = before == 3 ? 2 : 3;
  omp_set_num_threads(want);
  Recorder rec(m);
  {
    LoomEngine e(rec, EngineConfig{});
    e.start();
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    e.submit(prompt(6, 2), greedy(3), [&](const TokenEvent& ev) {
      std::lock_guard<std::mutex> l(mu);
      if (ev.finished) done = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> l(mu);
    EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(30), [&] { return done; }));
    l.unlock();
    e.stop(1.0);
  }
  omp_set_num_threads(before);
  ASSERT_FALSE(rec.seen.empty());
  for (int n : rec.seen) EXPECT_EQ(n, want);
}
