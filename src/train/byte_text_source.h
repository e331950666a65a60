// Byte-level fallback data: the bytes of plain-text files are the tokens (vocabulary 256).
// Each sample is T+1 consecutive bytes at an offset drawn from the counter-based RNG by
// (seed, sample index), so the source is deterministic, resumable from a sample count, and
// a data-parallel rank can draw its own disjoint samples without coordination.
#pragma once

#include <string>
#include <vector>

#include "train/batch.h"

namespace loom {

class ByteTextSource : public BatchSource {
 public:
  // `paths`: files or directories (read recursively, sorted); the last `valid_fraction` of the
  // bytes is held out: split "train" samples before it, "valid" after it. Data-parallel rank
  // `rank` of `world` draws only its rows of each global micro-batch: its micro-batch j is the
  // one-process micro-batch j * world + rank.
  ByteTextSource(const std::vector<std::string>& paths, int micro_batch, int seq_len, uint64_t seed,
                 double valid_fraction, const std::string& split, int rank = 0, int world = 1);

  void next(Batch& b) override;
  Json state() const override;
  void restore(const Json& state) override;
  int vocab() const override { return 256; }
  std::string describe() const override;

 private:
  std::string text_;
  size_t begin_ = 0, end_ = 0;  // the split's byte range
  int B_, T_;
  uint64_t seed_;
  int rank_, world_;
  int64_t sample_ = 0;  // samples of every rank drawn so far: the same on every rank
  std::string split_;
  size_t files_ = 0;
};

}  // namespace loom
