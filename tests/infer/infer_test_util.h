// What the engine tests share: a tiny model of either family (GQA for Llama) with weights large
// enough that greedy choices are clear, seeded prompts over its 64-token vocabulary, and greedy
// sampling parameters; and a seeded request's completions beside other requests.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/rng.h"
#include "infer/engine.h"
#include "infer/engine_api.h"
#include "infer/model_runner.h"
#include "model/model_config.h"

namespace loom::infer::test {

inline ModelConfig tiny(Family f) {
  ModelConfig c = model_preset(f == Family::GPT2 ? "tiny" : "tiny-llama");
  c.n_layer = 2, c.d_model = 32, c.n_head = 4, c.n_kv_head = f == Family::GPT2 ? 4 : 2;
  c.head_dim = 8, c.d_ff = 64, c.vocab = 64, c.max_seq = 96, c.init_std = 0.3f;
  return c;
}

// `prefix` followed by `len` seeded tokens.
inline std::vector<int32_t> prompt(int len, uint64_t seed,
                                   const std::vector<int32_t>& prefix = {}) {
  std::vector<int32_t> p = prefix;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(uniform_at(seed, 1, i) * 64));
  return p;
}

// Greedy decoding of exactly n tokens (end-of-sequence ignored).
inline SamplingParams greedy(int n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

// The tokens of each completion of a seeded request (prompt(8, 1) sampled by `p`) submitted to a
// fresh engine on `runner` after `others` requests without a seed (prompt(5 + i, 10 + i) sampled
// by `o`): others = 0 against more shows whether the rest of the batch moves a seeded text.
inline std::map<int, std::vector<int32_t>> seeded_completions(ModelRunner& runner,
                                                              const SamplingParams& p,
                                                              const SamplingParams& o, int others) {
  LoomEngine e(runner, EngineConfig{});
  std::map<int, std::vector<int32_t>> mine;
  for (int i = 0; i < others; ++i) e.submit(prompt(5 + i, 10 + i), o, [](const TokenEvent&) {});
  e.submit(prompt(8, 1), p, [&mine](const TokenEvent& ev) {
    mine[ev.index].insert(mine[ev.index].end(), ev.tokens.begin(), ev.tokens.end());
  });
  e.run_until_idle();
  return mine;
}

}  // namespace loom::infer::test
