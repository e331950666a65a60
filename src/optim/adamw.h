// AdamW over a ParamSet's flat buffers, with decoupled weight decay applied only to the
// parameters marked `decay`, on fp32 master weights. Under a reduced-precision policy the
// master copy is separate and the model's weights are re-rounded from it after each step; under
// bf16 (not ZeRO-3) in the update's own pass, which also writes the parameter set's bf16 copy
// when it has one (ParamSet::allocate_bf16_copy: what the bf16 GEMMs read).
//
// The one AdamW of Loom: one process steps the whole parameter set with it, and the
// data-parallel engine (parallel/data_parallel.h) steps each rank's shard, a flat range
// [lo, hi) of the same layout, with it too. Same elements, same kernel calls, same bits.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "model/params.h"
#include "optim/optimizer.h"

namespace loom {

class Config;

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};
AdamWConfig adamw_config_from(const Config& cfg);

class AdamW : public Optimizer {
 public:
  // The whole parameter set. param_dtype: the precision the model computes with (fp32: master
  // == model weights). The master copy starts from the model's weights.
  AdamW(ParamSet& params, const AdamWConfig& cfg, DType param_dtype, Backend& backend);
  // The flat range [lo, hi) of the parameter set's layout (a data-parallel shard): state for
  // those elements only. keep_master: a separate fp32 master even when param_dtype is fp32
  // (ZeRO-3: the model buffer does not keep the shard's weights between uses). The master
  // starts zero: the owner fills it (sync_master_from_model, or drawn in place).
  AdamW(ParamSet& params, const AdamWConfig& cfg, DType param_dtype, Backend& backend, int64_t lo,
        int64_t hi, bool keep_master);

  // One step on the gradients in the parameter set's gradient buffer, then the model's weights
  // re-derived from the master copy. Frozen parameters (ParamInfo::trainable false) are left
  // as they are.
  void step(double lr, float grad_scale) override;
  // The update alone, with grad[i] the gradient of element lo + i; the model's weights are left
  // to the caller (a sharded optimizer gathers them from every rank's master), except under
  // bf16 without ZeRO-3, where this rank's range [lo, hi) of them is written in the same pass
  // (write_model then has nothing left to do there).
  void update(double lr, float grad_scale, const float* grad);
  int64_t steps_taken() const override { return t_; }
  void set_steps_taken(int64_t t) override;

  // The state, per parameter overlapping [lo, hi): its slice of exp_avg, exp_avg_sq and (when
  // separate) master, as 1-D views.
  std::vector<StateSlice> state_slices() override;
  // The whole set's state by name, shaped like the parameters (one-process checkpoints).
  std::map<std::string, Tensor> state_tensors();
  // Re-derives the model's weights on [lo, hi) from the master copy (after loading a
  // checkpoint).
  void sync_model_from_master() override;
  // Copies the model's weights on [lo, hi) into the master copy (after initialisation or
  // import).
  void sync_master_from_model();
  // Master -> model (rounded to the compute type) on [a, b) ∩ [lo, hi): a shard's part of a
  // range about to be gathered. Nothing without a separate master.
  void write_model(int64_t a, int64_t b);

  int64_t lo() const { return lo_; }
  int64_t hi() const { return hi_; }
  // The weights this steps, element lo at index 0: the master copy, or the model's own buffer.
  float* weights();
  float* master();
  // The state's buffers (m, v and the master when separate) as (data, bytes), for memory
  // accounting.
  std::vector<std::pair<const void*, int64_t>> buffers() const;

 private:
  ParamSet& params_;
  AdamWConfig cfg_;
  DType param_dtype_;
  Backend& be_;
  int64_t lo_ = 0, hi_ = 0;
  // Over [lo_, hi_), allocated through the backend (buffer class "optimizer"; host memory on
  // the CPU) and zeroed; master_ empty when the model's buffer is it.
  BackendBuffer m_, v_, master_;
  float* m() const { return m_.as<float>(); }
  float* v() const { return v_.as<float>(); }
  int64_t t_ = 0;
  bool keep_master_ = false;
  // Master -> model on [a, b) (rounded; under bf16 also into the parameter set's bf16 copy).
  void write_model_range(int64_t a, int64_t b);
  // The bf16 policy: update() derived the model's weights on [lo_, hi_) in its own pass, so
  // write_model has nothing to do until the master may have changed otherwise (cleared by
  // whatever hands the master out or replaces it).
  bool model_written_ = false;
};

}  // namespace loom
