// ZeRO-3 for parameters that never change: LoRA's frozen base (and DPO's frozen reference
// model). Each data-parallel rank keeps only its shard of the model's flat parameter buffer
// (ceil(total / dp) elements, the same split as DataParallel's), a block's parameters are
// all-gathered just before the block runs (the next block's gather prefetched) and released
// after, and the parameters outside the blocks (embeddings, final norm, head) stay gathered.
// Nothing is reduced and nothing is stepped: there are no gradients, no optimizer state and no
// fp32 master, so the shard is simply the values as they were (already rounded to the compute
// type), and a gathered block is bit-identical to the whole model's.
//
// It drives the model's before_block / after_block hooks, so it cannot share a model with a
// ZeRO-3 DataParallel engine (which drives them for the trained parameters); a LoRA run pairs it
// with the adapters' engine at ZeRO 0-2, which uses only on_grads_ready.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/buffer.h"
#include "model/decoder.h"

namespace loom::parallel {

class FrozenShards {
 public:
  // `model`'s parameters hold their whole values (a tensor-parallel rank's local shard of them)
  // on every rank of `dp` now: this rank copies its part, and the blocks' pages are released.
  // Under pipeline parallelism, the stage's blocks (gathered within a chunk, released after
  // every use). take_values = false: the model holds nothing yet; the caller writes this
  // rank's shard into own() and the parameters outside the blocks into the model before the
  // first use (loading them so, no rank ever holds the whole model).
  FrozenShards(Decoder& model, comm::Communicator& dp, bool take_values = true);
  ~FrozenShards();
  FrozenShards(const FrozenShards&) = delete;
  FrozenShards& operator=(const FrozenShards&) = delete;

  int64_t shard_begin() const { return lo_; }
  int64_t shard_end() const { return hi_; }
  // The values of this rank's shard, [shard_begin(), shard_end()) of the flat buffer (writable:
  // see take_values; frozen once blocks are gathered). Memory of the model's backend: on a
  // device, written through Backend copies.
  float* own() { return own_.as<float>(); }
  // The most blocks gathered (in flight or resident) at once since construction: the block in
  // use and the prefetched next one.
  int max_gathered_units() const { return max_gathered_; }
  // The flat ranges of the parameters that stay gathered (outside the blocks).
  const std::vector<std::pair<int64_t, int64_t>>& resident_ranges() const { return resident_; }

 private:
  struct Range {
    int64_t lo = 0, hi = 0;
    std::vector<int64_t> counts;  // per rank: its shard's intersection with [lo, hi)
    comm::Work work;
  };
  struct Unit {  // one block's parameters: runs of the flat buffer
    std::vector<Range> ranges;
    enum State { Released, InFlight, Resident } state = Released;
  };
  std::vector<int64_t> counts_of(int64_t lo, int64_t hi) const;
  void gather(int l);   // starts block l's gathers unless it is there or on its way
  void release(int l);  // waits for them, then returns the block's pages
  std::pair<int, int> chunk_of(int l) const;
  void before(int l, bool backward);
  void after(int l, bool backward);

  Decoder& model_;
  ParamSet& P_;
  comm::Communicator& dp_;
  int n_layer_ = 0;
  int64_t before_id_ = -1, after_id_ = -1;  // our subscriptions to the model's block hooks
  int64_t total_ = 0, shard_ = 0, lo_ = 0, hi_ = 0;
  BackendBuffer own_;  // the values of [lo_, hi_), on the model's backend
  std::vector<Unit> units_;
  std::vector<std::pair<int64_t, int64_t>> resident_;
  int gathered_ = 0, max_gathered_ = 0;
};

}  // namespace loom::parallel
