// One training step of the trained parameters, whatever computes their gradients: the step's
// micro-batches (each a forward and backward with per-token loss weights, the gradients reduced
// by the optimizer's buckets as they fill), then the global gradient norm, the skip of a step
// with non-finite gradients (fp16: the loss scaler backs off), clipping, and the optimizer step.
// Pre-training, SFT and DPO step through it; the recipe only says what a micro-batch computes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "parallel/data_parallel.h"
#include "precision/policy.h"

namespace loom {

class StepEngine {
 public:
  // `dp` steps the trained parameters (every layout's optimizer: ZeRO 0-3 over its group, one
  // rank in one process). The squared gradient norm sums dp's local part weighted by
  // `norm_weights` (per trained parameter: 1 where this rank's copy counts, 0 where another
  // rank's copy of the same element does) over `norm_group`. `scaler`: fp16's loss scaler, used
  // with `loss_scaling` only. `clip_grad`: the global L2 norm the gradients are clipped to (0 =
  // off).
  StepEngine(parallel::DataParallel& dp, comm::Communicator& norm_group,
             std::vector<double> norm_weights, bool loss_scaling, const LossScaler& scaler,
             double clip_grad);

  // What a backward multiplies its loss by: the loss scaler's scale under fp16, else 1.
  double loss_scale() const { return loss_scaling_ ? scaler_.scale() : 1.0; }
  // Accumulates the step's gradients: micro(j) runs micro-batch j's forward and backward, for
  // j < micro_batches (a pipeline's schedule counts as one).
  void accumulate(int micro_batches, const std::function<void(int)>& micro);

  struct Update {
    double grad_norm = 0;  // the global L2 norm of the unscaled gradients
    bool skipped = false;  // non-finite gradients: the weights did not move
  };
  // Ends the step at learning rate `lr` on gradients that carry the loss scale `scale`
  // (`step` only names it in the warning of a skipped step).
  Update step(double lr, double scale, int64_t step);

  parallel::DataParallel& optimizer() { return dp_; }
  const parallel::DataParallel& optimizer() const { return dp_; }
  bool loss_scaling() const { return loss_scaling_; }
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }

 private:
  parallel::DataParallel& dp_;
  comm::Communicator& norm_group_;
  std::vector<double> norm_weights_;
  bool loss_scaling_;
  LossScaler scaler_;
  double clip_grad_;
};

}  // namespace loom
