// The small GPT-2 and Llama shapes and random micro-batches the bf16 model tests share
// (bf16_gemms_test.cpp, bf16_weights_test.cpp): 2 layers, width 64, vocabulary 96.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "model/decoder.h"

namespace loom::test {

inline ModelConfig small_bf16_model(Family f) {
  ModelConfig c = model_preset(f == Family::GPT2 ? "tiny" : "tiny-llama");
  c.n_layer = 2, c.d_model = 64, c.n_head = 4, c.n_kv_head = f == Family::GPT2 ? 4 : 2;
  c.head_dim = 16, c.d_ff = 128, c.vocab = 96, c.max_seq = 64;
  return c;
}

struct SmallBatch {
  std::vector<int32_t> tokens, targets, positions, cu;
  ModelInput input() const {
    return {tokens.data(),
            targets.data(),
            positions.data(),
            cu.data(),
            static_cast<int>(tokens.size()),
            static_cast<int>(cu.size()) - 1};
  }
};

// `rows` sequences of T tokens drawn from `seed` (ids below the vocabulary of 96).
inline SmallBatch small_batch(int rows, int T, uint64_t seed) {
  SmallBatch d;
  d.cu.push_back(0);
  for (int r = 0; r < rows; ++r) {
    for (int t = 0; t < T; ++t) {
      d.tokens.push_back(int32_t(uniform_at(seed, 1, d.tokens.size()) * 96));
      d.targets.push_back(int32_t(uniform_at(seed, 2, d.targets.size()) * 96));
      d.positions.push_back(t);
    }
    d.cu.push_back(int32_t(d.tokens.size()));
  }
  return d;
}

}  // namespace loom::test
