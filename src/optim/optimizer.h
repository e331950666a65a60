// The optimizer interface the trainer steps through, whatever holds the state: one process's
// AdamW over the whole parameter set, or the data-parallel engine (parallel/data_parallel.h),
// whose ranks each step a shard with the same AdamW. A LoRA-only optimizer is the same AdamW
// over the adapters' parameter set.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom {

// A named piece of a flattened parameter (or of its optimizer state): the elements
// [offset, offset + tensor.numel()) of a parameter of global_numel elements. Checkpoints place
// shards by these (ckpt::ShardInfo); a whole parameter is offset 0 and global_numel elements.
struct StateSlice {
  std::string name;      // "<param>" or "exp_avg.<param>", "exp_avg_sq.<param>", "master.<param>"
  Tensor tensor;         // 1-D view
  int64_t global_numel;  // the flattened parameter's size
  int64_t offset;        // where the slice starts within it
  // Set for values made on demand (a weight kept only as bf16, widened): `tensor` then gives
  // the shape alone (no memory) and fill(dst) writes the values into tensor.numel() floats.
  std::function<void(void* dst)> fill = {};
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One step at learning rate `lr`, every gradient multiplied by grad_scale first (loss-scale
  // unscaling and clipping folded into one factor), then the model's weights brought up to date.
  virtual void step(double lr, float grad_scale) = 0;
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t t) = 0;
  // The optimizer state this holds (exp_avg, exp_avg_sq and, when kept apart, the fp32 master).
  virtual std::vector<StateSlice> state_slices() = 0;
  // After restoring state: the model's weights re-derived from the master copy.
  virtual void sync_model_from_master() = 0;
};

}  // namespace loom
