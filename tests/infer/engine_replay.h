// The serving engine's schedules replayed on any Backend, for comparing a device engine with the
// CPU engine: the tiny models of infer_test_util.h (both families, GQA for Llama, fp32 or bf16
// activations and KV cache), prompts sharing a prefix, and the schedules of the engine tests
// (many requests at once, one at a time so later prompts hit the prefix cache, small prefill
// chunks, no chunking, and a pool so small it forces preemption). Each request decodes greedily
// with the sampled token's logprob reported.
#pragma once

#include <cstdint>
#include <map>
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

// What a replay produced: per request (in submit order) its tokens and their logprobs; and the
// engine's evidence that the schedule did what its name says.
struct Replay {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  int64_t preemptions = 0, cached_tokens = 0;
  int blocks_left_used = -1;
};

inline Replay replay(Backend& be, Family f, DType act, const ReplaySetup& s) {
  Decoder m(tiny(f), be, Recompute::None, act);
  m.params().init(5);
  DecoderRunner runner(m);
  const auto shared = prompt(20, 9);
  const std::vector<std::vector<int32_t>> prompts = {prompt(7, 1), prompt(5, 2, shared),
                                                     prompt(9, 3, shared), prompt(33, 4), shared};
  EngineConfig cfg;
  cfg.block_size = 8;
  cfg.num_blocks = s.blocks;
  cfg.scheduler.max_batched_tokens = s.budget;
  cfg.scheduler.chunked_prefill = s.chunked;
  LoomEngine e(runner, cfg);
  std::map<int64_t, size_t> index;
  Replay r;
  r.tokens.resize(prompts.size());
  r.logprobs.resize(prompts.size());
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 12;
  p.ignore_eos = true;
  p.logprobs = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t id = e.submit(prompts[i], p, [&r, &index](const TokenEvent& ev) {
      const size_t k = index.at(ev.request_id);
      r.tokens[k].insert(r.tokens[k].end(), ev.tokens.begin(), ev.tokens.end());
      r.logprobs[k].insert(r.logprobs[k].end(), ev.logprobs.begin(), ev.logprobs.end());
      if (ev.finished) r.cached_tokens += ev.usage.cached_prompt_tokens;
    });
    index[id] = i;
    if (!s.together) e.run_until_idle();
  }
  e.run_until_idle();
  r.preemptions = e.stats().preemptions_total;
  r.blocks_left_used = e.cache().num_used();
  return r;
}

}  // namespace loom::infer::test
