// Resharding: the mapping between a rank's local parameter elements and the whole (one-process)
// tensor, in both directions. Consolidation (ckpt/consolidate.h) places local pieces into whole
// tensors; a distributed run started from a one-process checkpoint (train.init_from,
// docs/parallel.md) extracts its local pieces from the whole tensors by the same mapping.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "ckpt/checkpoint.h"
#include "model/params.h"

namespace loom::ckpt {

// Calls fn(local, global, length) for every run of consecutive global (flattened) elements among
// the local elements [begin, begin + n) of parameter `p`: local element local + k sits at global
// element global + k for k < length (model/params.h, global_row_first).
template <class Fn>
void for_each_global_run(const ParamInfo& p, int64_t begin, int64_t n, Fn&& fn) {
  const int64_t len = local_row_length(p), end = begin + n;
  for (int64_t i = begin; i < end;) {
    const int64_t row = i / len, row_end = std::min(end, (row + 1) * len);
    fn(i, global_row_first(p, row) + (i - row * len), row_end - i);
    i = row_end;
  }
}

// Copies the local elements [begin, begin + n) of parameter `p` out of its whole tensor `whole`
// (global_numel(p) elements) into out[0, n): the inverse of consolidation's placement.
void extract_local(const ParamInfo& p, const float* whole, int64_t begin, int64_t n, float* out);

// A stored piece's placement as a flat range: the element count of the flattened tensor it is a
// piece of and where the piece starts, when the piece is contiguous in it (a slice of a
// flattened tensor, a whole tensor, or whole rows at a row offset). False otherwise.
bool flat_range(const ShardInfo& shard, const Shape& local, int64_t* global, int64_t* offset);

// Fills a rank's pieces of its local parameters from a one-process checkpoint's whole tensors.
// `model` and `optim` are what the rank's distributed checkpoint holds (named by parameter, and
// "exp_avg." / "exp_avg_sq." / "master." + parameter), each a flat range of the rank's local
// parameter as its ShardInfo says (a whole local tensor, or a slice of the flattened one);
// `local` is the rank's ParamSet, which knows where each local element sits in the whole tensor.
// Fp32 master weights the one-process checkpoint does not keep (its policy computes in fp32)
// come from its model weights. Reads only the parts of the mapped files it needs; checks every
// name, dtype and size before writing anything.
void fill_from_whole(const Checkpoint& whole, const ParamSet& local, const TensorList& model,
                     const TensorList& optim);

}  // namespace loom::ckpt
