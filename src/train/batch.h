// A micro-batch as the trainer holds it: token ids, next-token targets (-1 = no loss), each
// token's position within its sequence, and sequence boundaries (cu_seqlens).
#pragma once

#include <cstdint>
#include <vector>

#include "core/json.h"
#include "model/decoder.h"

namespace loom {

struct Batch {
  int B = 0, T = 0;  // rows and tokens per row (packed batches: B=1, T=N)
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
  // KTO micro-batches (PreferenceSource over unpaired examples): per example k, 1 when its
  // reply (row 2k) is desirable, 0 when not; empty otherwise.
  std::vector<int8_t> labels;
  // Preference micro-batches: each row's tokens before its padding (a reward model's score is
  // read at the last of them); empty otherwise.
  std::vector<int32_t> lengths;

  int64_t valid_targets() const;
  ModelInput input() const;
  // B rows of T tokens, each row its own sequence: cu_seqlens = {0, T, 2T, ...}.
  void set_rows(int B, int T);
};

// B rows of T random tokens and targets in [0, vocab), drawn from the counter-based RNG by
// (seed, element): the same batch for the same arguments (benchmarks, tests).
Batch synthetic_batch(int B, int T, int vocab, uint64_t seed);

// Where batches come from. Deterministic for its seed and resumable from state().
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void next(Batch& b) = 0;
  virtual Json state() const = 0;
  virtual void restore(const Json& state) = 0;
  virtual int vocab() const = 0;  // token ids lie in [0, vocab)
  virtual std::string describe() const = 0;
};

}  // namespace loom
