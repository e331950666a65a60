#include "train/step_engine.h"

#include <cmath>

#include "core/log.h"

namespace loom {

StepEngine::StepEngine(parallel::DataParallel& dp, comm::Communicator& norm_group,
                       std::vector<double> norm_weights, bool loss_scaling,
                       const LossScaler& scaler, double clip_grad)
    : dp_(dp),
      norm_group_(norm_group),
      norm_weights_(std::move(norm_weights)),
      loss_scaling_(loss_scaling),
      scaler_(scaler),
      clip_grad_(clip_grad) {}

void StepEngine::accumulate(int micro_batches, const std::function<void(int)>& micro) {
  // Distributed, gradient buckets reduce during the backward of the last micro-batch (every
  // micro-batch under ZeRO-2/3); each element's reduced gradient is then counted on exactly one
  // DP rank.
  dp_.start_step(micro_batches);
  for (int j = 0; j < micro_batches; ++j) {
    dp_.start_micro(j);
    micro(j);
    dp_.finish_micro();
  }
}

StepEngine::Update StepEngine::step(double lr, double scale, int64_t step) {
  const double sq =
      norm_group_.all_reduce_scalar(dp_.grad_sq_local(norm_weights_), comm::ReduceOp::Sum);
  Update u;
  const bool finite = std::isfinite(sq);
  u.grad_norm = std::sqrt(sq) / scale;
  const bool proceed = loss_scaling_ ? scaler_.update(finite) : finite;
  if (!finite && !loss_scaling_) log_warn("step ", step, ": non-finite gradients; step skipped");
  if (proceed) {
    float grad_scale = static_cast<float>(1.0 / scale);
    if (clip_grad_ > 0 && u.grad_norm > clip_grad_)
      grad_scale *= static_cast<float>(clip_grad_ / u.grad_norm);
    dp_.step(lr, grad_scale);
  }
  u.skipped = !proceed;
  return u;
}

}  // namespace loom
