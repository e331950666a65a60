// Token sampling from logits: temperature, top-k and nucleus (top-p) filtering, then a draw
// from the counter-based RNG, so a (seed, position) pair always picks the same token.
#pragma once

#include <cstdint>

namespace loom {

struct SamplingOptions {
  float temperature = 1.0f;  // 0 = greedy (argmax)
  int top_k = 0;             // 0 = no top-k filter
  float top_p = 1.0f;        // 1 = no nucleus filter
  uint64_t seed = 0;
};

void validate(const SamplingOptions& o);

// Picks a token from logits[V]; `draw` indexes the random stream (e.g. the output position).
int sample_token(const float* logits, int V, const SamplingOptions& o, uint64_t draw);

}  // namespace loom
