#include "train/batch.h"

#include "core/rng.h"

namespace loom {

int64_t Batch::valid_targets() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t >= 0;
  return n;
}

ModelInput Batch::input() const {
  ModelInput in;
  in.tokens = tokens.data();
  in.targets = targets.data();
  in.positions = positions.data();
  in.cu_seqlens = cu_seqlens.data();
  in.N = static_cast<int>(tokens.size());
  in.nseq = static_cast<int>(cu_seqlens.size()) - 1;
  return in;
}

void Batch::set_rows(int rows, int cols) {
  B = rows;
  T = cols;
  size_t n = static_cast<size_t>(rows) * cols;
  tokens.resize(n);
  targets.resize(n);
  positions.resize(n);
  cu_seqlens.resize(rows + 1);
  for (int r = 0; r <= rows; ++r) cu_seqlens[r] = r * cols;
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) positions[static_cast<size_t>(r) * cols + t] = t;
}

Batch synthetic_batch(int B, int T, int vocab, uint64_t seed) {
  Batch b;
  b.set_rows(B, T);
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    b.tokens[i] = static_cast<int32_t>(uniform_at(seed, 1, i) * vocab);
    b.targets[i] = static_cast<int32_t>(uniform_at(seed, 2, i) * vocab);
  }
  return b;
}

}  // namespace loom
