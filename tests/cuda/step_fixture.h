// A small packed micro-batch for whole-step tests: three documents, some ignored targets.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/grad_check.h"
#include "model/model_config.h"

namespace loom::test {

struct StepBatch {
  std::vector<int32_t> tokens, targets, positions, cu;
  int N = 0, nseq = 0;
};

inline StepBatch make_batch(const ModelConfig& cfg, std::vector<int32_t> cu, uint64_t seed) {
  StepBatch b;
  b.cu = std::move(cu);
  b.nseq = static_cast<int>(b.cu.size()) - 1;
  b.N = b.cu.back();
  b.tokens = random_ints(b.N, seed, 0, cfg.vocab - 1);
  b.targets = random_ints(b.N, seed + 1, 0, cfg.vocab - 1);
  for (int i = 0; i < b.N; i += 7) b.targets[i] = -1;  // no loss at these positions
  b.positions.resize(b.N);
  for (int s = 0; s < b.nseq; ++s)
    for (int i = b.cu[s]; i < b.cu[s + 1]; ++i) b.positions[i] = i - b.cu[s];
  return b;
}

}  // namespace loom::test
