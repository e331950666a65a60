// Data parallelism over a Decoder's flat parameter and gradient buffers, from plain DDP to
// ZeRO-3, as one engine (docs/parallel.md):
//
//   zero 0  every rank keeps everything; gradients all-reduced in buckets.
//   zero 1  optimizer state and fp32 master weights sharded: gradients reduce-scattered in
//           buckets (last micro-batch only), each rank steps its shard, parameters all-gathered.
//   zero 2  gradients sharded too: buckets reduce-scattered after every micro-batch into a
//           shard accumulator and their full-size pages released.
//   zero 3  parameters sharded too: each block's parameters gathered just before use (the next
//           block's gather prefetched) and released after; embeddings, final norm and head stay
//           gathered between steps (MoE experts too, sharded over the expert-data-parallel
//           group under expert parallelism). Under pipeline parallelism the same, block by block
//           within a chunk, with nothing kept between a chunk's uses.
//
// Gradients are reduced in fp32, or (grad_reduce_dtype = BF16, Megatron's reduced-precision
// reduction) rounded to bf16 and sent as bf16, half the bytes, with the sums accumulated in
// fp32 (Communicator::reduce_scatter_bf16_async); the optimizer steps in fp32 either way.
//
// Shards are contiguous ranges of the flat buffer, ceil(total / dp) elements each (the last
// ranks may hold fewer or none), so any size works (flat_shards.h). The engine is three parts:
// the gradient reduction (grad_reduce.h: buckets reduced during backward), the sharded
// optimizer (this class: the one AdamW over this rank's shard, and the experts'), and the
// parameter gathering (param_gather.h: ZeRO-1/2 after each step, ZeRO-3 block by block).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "parallel/flat_shards.h"
#include "parallel/grad_reduce.h"
#include "parallel/page_memory.h"
#include "parallel/param_gather.h"

namespace loom {
class Config;
}

namespace loom::parallel {

struct DataParallelOptions {
  int zero = 0;                    // 0..3
  int64_t bucket_elems = 1 << 20;  // gradient elements per bucket (parallel.bucket_mb)
  bool overlap = true;             // start reductions during backward (false: after it)
  // parallel.grad_reduce_dtype: F32, or BF16: each rank's gradients rounded to bf16 (nearest
  // even) and communicated as bf16, the sums accumulated in fp32. ZeRO >= 1 keep that fp32 sum;
  // ZeRO-0's all-reduce is a bf16 reduce-scatter then a bf16 all-gather of the sums, so its
  // reduced gradients are those sums rounded to bf16 (the same on every rank).
  DType grad_reduce_dtype = DType::F32;
  // Set: the model comes uninitialised and the engine draws its initial weights (ParamSet::init
  // with this seed, rounded to the parameter dtype). ZeRO-3 then draws only what this rank
  // keeps, its master shard and the parameters that stay gathered, and never touches the pages
  // of the other ranks' blocks: no rank ever holds the whole model.
  std::optional<uint64_t> init_seed;
  static DataParallelOptions from(const Config& cfg);
};

// Resident (physically backed) bytes of each kind of training state on this rank, measured
// with mincore() over the buffers that hold them.
struct MemoryUse {
  int64_t params = 0, grads = 0, optim = 0;
  int64_t total() const { return params + grads + optim; }
};

// The engine is the Optimizer of a data-parallel run: its step() steps this rank's shard with
// the one AdamW (optim/adamw.h) and brings the parameters back into place.
class DataParallel : public Optimizer {
 public:
  // Under expert parallelism (the model's expert_parallel().size > 1) the experts' weights (the
  // tail of the flat buffer, ParamInfo::expert) differ between the data-parallel ranks: they
  // are kept apart and reduced over `expert_dp` (the ranks holding the same experts). ZeRO 0-2:
  // all-reduced and stepped whole on each of them (ZeRO-0 for experts). ZeRO-3: sharded over
  // `expert_dp` like the dense part over `dp` (reduce-scattered once per step, each rank steps
  // its shard, a block's experts gathered around its use with the block's other parameters).
  //
  // `trained` (LoRA): the engine reduces and steps that parameter set instead of the model's
  // own (adapters named "blocks.<l>.…" like the layers they adapt, so their buckets start as
  // backward leaves each block); the model's parameters stay as they are, replicated and
  // frozen. ZeRO 0-2 only (ZeRO-3 here would gather and step the trained set; a LoRA run
  // shards its frozen base with parallel::FrozenShards instead, frozen_shards.h).
  DataParallel(Decoder& model, comm::Communicator& dp, const DataParallelOptions& opt,
               const AdamWConfig& adam, DType param_dtype, Backend& backend,
               comm::Communicator* expert_dp = nullptr, ParamSet* trained = nullptr);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // One optimizer step of `micro_batches` forward_backward calls:
  //   start_step(k); for m in 0..k-1 { start_micro(m); model.forward_backward(...);
  //   finish_micro(); } then grad_sq_local() / step().
  void start_step(int micro_batches);
  void start_micro(int m);
  void finish_micro();

  // Sum of squared reduced gradients over the elements this rank owns (each element of the
  // model counted on exactly one data-parallel rank), with each parameter weighted by
  // `weights` (by parameter index; empty = all 1: TP-replicated parameters pass 0 on all but
  // one tensor-parallel rank). All-reduce the result over the groups that own disjoint parts.
  double grad_sq_local(const std::vector<double>& weights = {}) const;

  // AdamW on this rank's shard with each gradient multiplied by grad_scale, then the
  // parameters brought back into place (all-gathered for ZeRO-1/2; gathered on demand for 3).
  void step(double lr, float grad_scale) override;
  int64_t steps_taken() const override { return adam_->steps_taken(); }
  void set_steps_taken(int64_t t) override;

  // Optimizer state of this rank's shard: per parameter, the slice [a, b) of its flattened
  // elements this rank owns, named "exp_avg.<param>" etc. (global_offset = a).
  using StateSlice = loom::StateSlice;
  std::vector<StateSlice> state_slices() override;
  // The weights this rank keeps authoritative copies of, named by parameter: ZeRO-0 every
  // parameter whole (offset 0); ZeRO >= 1 the owned slice of each flattened parameter (from the
  // fp32 master when there is one). Restoring them, then sync_model_from_master(), resumes.
  std::vector<StateSlice> param_slices();
  // The slices a save reads: param_slices(), except at ZeRO-0 under the 2-byte weights, where a
  // dropped parameter comes as a fill (StateSlice::fill) that widens its bf16 copy while the
  // writer writes it: one parameter's fp32 values at a time, not the whole container's.
  std::vector<StateSlice> save_slices();
  // The slices a load writes (a resume, train.pretrained, train.init_from): param_slices(),
  // except at ZeRO-0 under the 2-byte weights (ParamSet::drop_fp32), where a dropped
  // parameter, which has no fp32 values in the model to fill, is read straight into its fp32
  // master: the load never rebuilds the model's fp32 container. Views, written in place.
  std::vector<StateSlice> load_slices();
  // After loading the shard's master weights (ZeRO-3, or a separate master copy): refresh the
  // model's parameters from them everywhere.
  void sync_model_from_master() override;
  // After load_slices() were written from outside with new weights (train.pretrained, an
  // imported checkpoint): under ZeRO-0 those slices are the model's own weights, so the master
  // copy (bf16, fp16) takes them first (the dropped parameters' slices were the master
  // already); ZeRO >= 1's slices are the master itself. Then sync_model_from_master() puts
  // them everywhere.
  void sync_master_from_model();

  // The reduced gradient of this rank's shard (ZeRO >= 1), for tests and inspection.
  std::vector<float> reduced_grad_shard() const;
  MemoryUse memory_use() const;
  int zero() const { return opt_.zero; }
  int64_t shard_begin() const { return lo_; }
  int64_t shard_end() const { return hi_; }
  size_t num_buckets() const { return reducer_->num_buckets(); }
  // Seconds this rank spent waiting for gradient reductions after backward (finish_micro),
  // summed since construction: the part of DP communication not hidden behind backward.
  double exposed_comm_seconds() const { return reducer_->exposed_seconds(); }
  // Bucket reductions started so far, and how many of them started inside backward (from the
  // on_grads_ready hook) rather than after it.
  int64_t reductions_started() const { return reducer_->started(); }
  int64_t reductions_started_in_backward() const { return reducer_->started_in_backward(); }
  // Bytes of gradient data this rank has put on the wire for reductions since construction,
  // counted as a bandwidth-optimal (ring) algorithm moves them: a reduce-scatter or all-gather
  // of a bucket of n elements sends the n - own elements of the other ranks' blocks, an
  // all-reduce twice that, at the element size of the payload (4 for fp32, 2 for bf16).
  int64_t grad_wire_bytes() const { return reducer_->wire_bytes(); }
  // The same for the parameter all-gathers of ZeRO >= 1 (0 at ZeRO-0): 2 bytes per element
  // under the 2-byte weights (the bf16 copy gathered), 4 otherwise.
  int64_t param_gather_wire_bytes() const { return gatherer_ ? gatherer_->wire_bytes() : 0; }
  // ZeRO-3: the most block units gathered (in flight or resident) at once since construction
  // or the last reset: at most the block in use and the prefetched next one.
  int max_gathered_units() const { return gatherer_ ? gatherer_->max_gathered_units() : 0; }
  void reset_max_gathered_units() {
    if (gatherer_) gatherer_->reset_max_gathered_units();
  }

 private:
  // ZeRO-0's slices: every parameter whole, a dropped one as a fill widening its bf16 copy.
  std::vector<StateSlice> whole_slices();
  void draw_initial_weights(uint64_t seed);
  bool reduces_now() const;
  // Expert-parallel experts: [expert_lo_, expert_hi_) of the flat buffer (empty otherwise).
  bool experts_apart() const { return expert_hi_ > expert_lo_; }
  // ZeRO-3 with expert parallelism: the experts sharded over edp_ too ([elo_, ehi_) here).
  bool experts_sharded() const { return experts_apart() && opt_.zero == 3; }
  void expert_adam(double lr, float gs);

  Decoder& model_;
  ParamSet& P_;
  comm::Communicator& dp_;
  DataParallelOptions opt_;
  DType param_dtype_;
  Backend& be_;
  int n_layer_;
  int64_t total_, lo_, hi_;  // the dense part [0, total_); [lo_, hi_): this rank's shard
  FlatShards shards_;        // the dense part over dp_
  // AdamW on this rank's part of the dense parameters: all of them under ZeRO-0, [lo_, hi_)
  // otherwise (with an fp32 master under a reduced-precision policy, and always under ZeRO-3).
  std::unique_ptr<AdamW> adam_;
  // ZeRO >= 1: the reduced gradients of [lo_, hi_), Backend memory ("gradients"; empty when
  // this rank owns no element).
  BackendBuffer gshard_;
  comm::Communicator* edp_ = nullptr;
  int64_t expert_lo_ = 0, expert_hi_ = 0;
  // The experts' part this rank steps: all of [expert_lo_, expert_hi_), or under ZeRO-3 its
  // shard over edp_ (ceil(experts / edp) elements each, like the dense shards).
  FlatShards eshards_;  // the experts over edp_ (ZeRO-3), or whole
  int64_t elo_ = 0, ehi_ = 0;
  std::unique_ptr<AdamW> expert_adam_;  // the experts' optimizer, on [elo_, ehi_)
  BackendBuffer egshard_;               // ZeRO-3: the experts' reduced gradients on [elo_, ehi_)
  int micro_ = 0, micros_ = 1;
  std::unique_ptr<GradReducer> reducer_;
  int64_t grads_ready_id_ = -1;              // our subscription to the model's on_grads_ready
  std::unique_ptr<ParamGatherer> gatherer_;  // ZeRO >= 1
};

}  // namespace loom::parallel
