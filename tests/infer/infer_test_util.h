// What the engine tests share: a tiny model of either family (GQA for Llama) with weights large
// enough that greedy choices are clear, seeded prompts over its 64-token vocabulary, and greedy
// sampling parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "infer/engine_api.h"
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

}  // namespace loom::infer::test
