// AdamW over a ParamSet's flat buffers, with decoupled weight decay applied only to the
// parameters marked `decay`, on fp32 master weights. Under a reduced-precision policy the
// master copy is separate and the model's weights are re-rounded from it after each step.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/params.h"

namespace loom {

class Config;

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};
AdamWConfig adamw_config_from(const Config& cfg);

class AdamW {
 public:
  // param_dtype: the precision the model computes with (fp32: master == model weights).
  AdamW(ParamSet& params, const AdamWConfig& cfg, DType param_dtype, Backend& backend);

  // One step at learning rate `lr`; each gradient is multiplied by grad_scale first. Frozen
  // parameters (ParamInfo::trainable false) are left as they are.
  void step(double lr, float grad_scale);
  int64_t steps_taken() const { return t_; }

  // State for checkpoints: m, v and (when separate) the fp32 master weights.
  std::map<std::string, Tensor> state_tensors();
  void set_steps_taken(int64_t t) { t_ = t; }
  // Re-derives the model's weights from the master copy (after loading a checkpoint).
  void sync_model_from_master();
  // Copies the model's weights into the master copy (after initialisation or import).
  void sync_master_from_model();

 private:
  ParamSet& params_;
  AdamWConfig cfg_;
  DType param_dtype_;
  Backend& be_;
  Tensor m_, v_, master_;  // master_ undefined when param_dtype == F32
  int64_t t_ = 0;
};

}  // namespace loom
