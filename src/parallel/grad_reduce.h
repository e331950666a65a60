// Data parallelism's gradient reduction: the flat gradient buffer of the dense parameters in
// buckets, each reduced over the data-parallel group as soon as backward has finished its
// gradients (the Decoder's on_grads_ready hook), overlapping the rest of backward.
//
// Buckets are contiguous runs of whole parameters in backward order (head and final norm, blocks
// last to first, embeddings), closed at bucket_elems. ZeRO-0 all-reduces a bucket in place;
// ZeRO >= 1 reduce-scatter it to the owners of its elements (FlatShards): ZeRO-1 straight into
// the owner's gradient shard, ZeRO-2/3 into scratch added to the shard, after which the bucket's
// full-size pages are released. With grad_reduce_dtype = BF16 the gradients travel as bf16 and
// are summed in fp32 (ZeRO-0 then all-gathers the rounded sums).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "model/params.h"
#include "parallel/flat_shards.h"

namespace loom::parallel {

class GradReducer {
 public:
  // The dense part [0, shards.base + shards.n) of P's gradient buffer over `dp`; `shard_grads`
  // (ZeRO >= 1) the reduced gradients of this rank's shard; stages: per parameter of P, the
  // backward stage after which its gradient is final (see DataParallel).
  GradReducer(ParamSet& P, comm::Communicator& dp, const FlatShards& shards, int zero,
              int64_t bucket_elems, bool overlap, DType reduce_dtype, Backend& be,
              float* shard_grads, const std::vector<int>& stages);
  ~GradReducer();  // waits for what is in flight
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // A micro-batch starts; `reduces`: its gradients are reduced (the last micro-batch of a step,
  // or every one under ZeRO-2/3).
  void start_micro(bool reduces);
  // From the on_grads_ready hook: launches every bucket final once backward reached `stage`.
  void on_ready(int stage);
  // After backward: launches the rest, waits for every reduction and completes it.
  void finish();

  size_t num_buckets() const { return buckets_.size(); }
  double exposed_seconds() const { return exposed_seconds_; }
  int64_t started() const { return started_; }
  int64_t started_in_backward() const { return started_in_backward_; }
  int64_t wire_bytes() const { return wire_bytes_; }
  // Resident bytes of the transient buffers (scratch and bf16 wire copies).
  int64_t resident_scratch_bytes() const;

 private:
  struct Bucket {
    int64_t lo = 0, hi = 0;  // flat range
    int stage = 0;           // ready once backward reached this stage
    bool launched = false;
    comm::Work work;
    std::vector<int64_t> counts;  // per rank: its shard's intersection with [lo, hi)
    int64_t own_lo = 0;           // this rank's intersection start (when counts[rank] > 0)
    // Reduce-scatter target for ZeRO-2/3 (and bf16 ZeRO-0): Backend memory ("scratch"; device
    // memory on a GPU, where the collective and the add into the shard run), held only while
    // the bucket's reduction is in flight.
    BackendBuffer scratch;
    // bf16 reduction: this rank's gradients rounded to bf16 (ZeRO-0: then every rank's sums,
    // gathered), Backend memory ("scratch"; the casts are Backend::convert); transient, like
    // scratch.
    BackendBuffer wire;
  };

  void build(int64_t bucket_elems, const std::vector<int>& stages);
  void launch(Bucket& b);
  void launch_bf16(Bucket& b);
  float* reduce_target(Bucket& b);
  void gather_bf16_sums(Bucket& b);
  void complete(Bucket& b);
  bool bf16() const { return reduce_dtype_ == DType::BF16; }

  ParamSet& P_;
  comm::Communicator& dp_;
  FlatShards shards_;
  int zero_;
  bool overlap_;
  DType reduce_dtype_;
  Backend& be_;
  float* shard_grads_;
  int64_t lo_, hi_;  // this rank's shard
  std::vector<Bucket> buckets_;
  bool reduces_ = false;
  double exposed_seconds_ = 0;
  int64_t started_ = 0, started_in_backward_ = 0, wire_bytes_ = 0;
};

}  // namespace loom::parallel
