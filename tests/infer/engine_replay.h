// The serving engine's schedules replayed on any Backend, for comparing the engine with the
// no-cache forward (engine_test.cpp) and a device engine with the CPU engine: the tiny models of
// infer_test_util.h (both families, GQA for Llama, fp32 or bf16 activations and KV cache), prompts
// sharing a prefix, and the schedules of the engine tests (many requests at once, one at a time so
// later prompts hit the prefix cache, small prefill chunks, no chunking, and a pool so small it
// forces preemption). Each request decodes greedily with the sampled token's logprob and the two
// best tokens' logprobs reported.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "infer/model_runner.h"
#include "kernels/backend.h"
#include "model/decoder.h"

#include "infer_test_util.h"

namespace loom::infer::test {

struct ReplaySetup {
  const char* name;
  int blocks, budget;
  bool chunked, together;
};

inline std::vector<ReplaySetup> replay_setups() {
  return {{"many at once", 64, 256, true, true},
          {"one at a time", 64, 256, true, false},
          {"small chunks", 64, 8, true, true},
          {"no chunking", 64, 64, false, true},
          {"preemption", 7, 32, true, true}};
}

// The prompts every replay submits (in this order): two of them extend the last one, so their
// prefix can be found in the cache.
inline std::vector<std::vector<int32_t>> replay_prompts() {
  const auto shared = prompt(20, 9);
  return {prompt(7, 1), prompt(5, 2, shared), prompt(9, 3, shared), prompt(33, 4), shared};
}

// The number of tokens each replayed request decodes.
constexpr int kReplayTokens = 12;

// What a replay produced: per request (in submit order) its tokens, their logprobs, how clear each
// greedy choice was (the best token's logprob minus the second best's), its finish reason and its
// prompt tokens found in the cache; and the engine's evidence that the schedule did what its name
// says.
struct Replay {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs, margins;
  std::vector<std::string> finish_reasons;
  std::vector<int64_t> cached_prompt_tokens;
  int64_t preemptions = 0, cached_tokens = 0;
  int64_t draft_tokens = 0, accepted_tokens = 0;  // speculative guesses made and kept
  int blocks_left_used = -1;
  int draft_blocks_left_used = 0;  // the draft model's pool (speculative method Draft)
};

// The schedule `s` on the model `m` (with speculative decoding as `spec` says, the KV pool
// storing `kv`, `draft` the draft model for method Draft).
inline Replay replay(Decoder& m, const ReplaySetup& s, const SpeculativeConfig& spec = {},
                     KvCacheDtype kv = KvCacheDtype::Auto, Decoder* draft = nullptr) {
  DecoderRunner runner(m);
  std::unique_ptr<DecoderRunner> draft_runner;
  if (draft) draft_runner = std::make_unique<DecoderRunner>(*draft);
  const std::vector<std::vector<int32_t>> prompts = replay_prompts();
  EngineConfig cfg;
  cfg.block_size = 8;
  cfg.num_blocks = s.blocks;
  cfg.scheduler.max_batched_tokens = s.budget;
  cfg.scheduler.chunked_prefill = s.chunked;
  cfg.speculative = spec;
  cfg.kv_cache_dtype = kv;
  LoomEngine e(runner, cfg, draft_runner.get());
  std::map<int64_t, size_t> index;
  Replay r;
  r.tokens.resize(prompts.size());
  r.logprobs.resize(prompts.size());
  r.margins.resize(prompts.size());
  r.finish_reasons.resize(prompts.size());
  r.cached_prompt_tokens.resize(prompts.size(), -1);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = kReplayTokens;
  p.ignore_eos = true;
  p.logprobs = 2;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t id = e.submit(prompts[i], p, [&r, &index](const TokenEvent& ev) {
      const size_t k = index.at(ev.request_id);
      r.tokens[k].insert(r.tokens[k].end(), ev.tokens.begin(), ev.tokens.end());
      r.logprobs[k].insert(r.logprobs[k].end(), ev.logprobs.begin(), ev.logprobs.end());
      for (const auto& top : ev.top_logprobs)
        r.margins[k].push_back(top.at(0).second - top.at(1).second);
      if (ev.finished) {
        r.finish_reasons[k] = ev.finish_reason;
        r.cached_prompt_tokens[k] = ev.usage.cached_prompt_tokens;
        r.cached_tokens += ev.usage.cached_prompt_tokens;
      }
    });
    index[id] = i;
    if (!s.together) e.run_until_idle();
  }
  e.run_until_idle();
  r.preemptions = e.stats().preemptions_total;
  r.draft_tokens = e.stats().spec_draft_tokens_total;
  r.accepted_tokens = e.stats().spec_accepted_tokens_total;
  r.blocks_left_used = e.cache().num_used();
  if (e.draft()) r.draft_blocks_left_used = e.draft()->cache().num_used();
  return r;
}

// The schedule `s` on the tiny model of family `f` (seed 5) on `be` with activations in `act`.
inline Replay replay(Backend& be, Family f, DType act, const ReplaySetup& s) {
  Decoder m(tiny(f), be, Recompute::None, act);
  m.params().init(5);
  return replay(m, s);
}

// What differs between the replays `want` (the reference) and `got` of one schedule, each item
// followed by `at` ("" when nothing): the tokens, the schedule (preemptions, prefix hits), the
// blocks `got` left in use, and each request's logprobs, which `agree(got, want)` compares
// ("" when they agree, else how they differ). With `tie` > 0 a request's tokens may part where
// the reference's two best tokens are less than `tie` apart (a near tie that rounding can turn
// either way); its continuation from there is not compared.
template <typename Agree>
std::string replay_differences(const Replay& want, const Replay& got, Agree agree,
                               const std::string& at, double tie = 0) {
  std::string bad;
  if (got.preemptions != want.preemptions || got.cached_tokens != want.cached_tokens)
    bad += " schedule (preemptions " + std::to_string(got.preemptions) + " vs " +
           std::to_string(want.preemptions) + ", cached prompt tokens " +
           std::to_string(got.cached_tokens) + " vs " + std::to_string(want.cached_tokens) + ")" +
           at;
  if (got.blocks_left_used != 0) bad += " blocks not freed" + at;
  if (got.tokens.size() != want.tokens.size() || got.logprobs.size() != want.logprobs.size())
    return bad + " request count" + at;
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    const std::vector<int32_t>&w = want.tokens[i], &g = got.tokens[i];
    size_t same = 0;
    while (same < w.size() && same < g.size() && w[same] == g[same]) ++same;
    if (same < w.size() || same < g.size()) {
      const bool tied = same < w.size() && same < g.size() && want.margins[i].at(same) < tie;
      if (!tied)
        bad += " tokens of request " + std::to_string(i) + " (from index " + std::to_string(same) +
               (same < want.margins[i].size() ? ", where the reference's best two are " +
                                                    std::to_string(want.margins[i][same]) + " apart"
                                              : "") +
               ")" + at;
    }
    const auto head = [same](const std::vector<float>& v) {
      return std::vector<float>(v.begin(), v.begin() + std::min(same, v.size()));
    };
    const std::string why = agree(head(got.logprobs[i]), head(want.logprobs[i]));
    if (!why.empty()) bad += " logprobs of request " + std::to_string(i) + " (" + why + ")" + at;
  }
  return bad;
}

}  // namespace loom::infer::test
