#include "rl/learner_engine.h"

#include "core/error.h"
#include "parallel/tensor_parallel.h"
#include "precision/bf16_gemms.h"
#include "train/frozen_reference.h"

namespace loom::rl {

LearnerEngine::LearnerEngine(Decoder& policy, const LearnerEngineOptions& opt,
                             comm::Communicator* dp, comm::Communicator* expert_dp,
                             comm::Communicator* norm_group)
    : precision_(opt.precision) {
  LOOM_CHECK(policy.act_dtype() == opt.precision.compute, "the GRPO policy computes in ",
             dtype_name(policy.act_dtype()), ", but precision.policy = \"", opt.precision.name,
             "\" computes in ", dtype_name(opt.precision.compute));
  Backend& be = policy.backend();
  if (!dp) {
    self_dp_ = comm::make_self_communicator("rl-learner");
    dp = self_dp_.get();
  }
  if (!expert_dp && policy.expert_parallel().size > 1) {
    self_edp_ = comm::make_self_communicator("rl-learner-edp");
    expert_dp = self_edp_.get();
  }
  parallel::DataParallelOptions dpo;
  dpo.zero = opt.zero;
  dpo.grad_reduce_dtype = opt.grad_reduce;
  // The policy arrives with its starting weights: the engine's master takes them as they are
  // (fp32), and the policy's copy is then rounded to the compute type from it.
  dp_ = std::make_unique<parallel::DataParallel>(policy, *dp, dpo, opt.adam, opt.precision.compute,
                                                 be, expert_dp);
  if (opt.precision.compute != DType::F32) dp_->sync_model_from_master();
  const TensorParallel& tp = policy.tensor_parallel();
  std::vector<double> norm_weights =
      parallel::grad_norm_weights(policy.params(), tp.rank, policy.expert_parallel().tp_size);
  LossScaler scaler;
  if (opt.precision.loss_scaling) scaler = LossScaler(opt.scaler);
  engine_ =
      std::make_unique<StepEngine>(*dp_, norm_group ? *norm_group : *dp, std::move(norm_weights),
                                   opt.precision.loss_scaling, scaler, opt.clip_grad);
  // bf16 GEMMs where the CPU has them (not under ZeRO-3, as in loom train: the recipe keeps a
  // bf16 copy of every weight). The policy keeps its fp32 container of rounded values, which
  // the rollouts, the reference's copy and the weight sync read.
  const bool bf16 = opt.precision.compute == DType::BF16 && opt.zero < 3 && be.host_accessible();
  if (bf16) recipes_.bf16 = attach_bf16_gemms(policy, opt.quiet);
  if (opt.reference) {
    reference_ = frozen_copy_of(policy, *dp_, *dp);
    // The reference's forward multiplies as the policy's does, so that at the starting weights
    // their log-probabilities agree to the bit.
    if (bf16 && recipes_.bf16) reference_bf16_ = attach_bf16_gemms(*reference_.model, true);
  }
}

LearnerEngine::~LearnerEngine() {
  reference_bf16_.reset();
  reference_.shards.reset();  // it gathers over dp's group, into the reference model
  reference_.model.reset();
}

void LearnerEngine::weights_restored() {
  dp_->sync_model_from_master();
  recipes_.new_weights();
}

}  // namespace loom::rl
