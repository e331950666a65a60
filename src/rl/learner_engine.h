// The GRPO learner's training engine, made of the pieces assemble() makes for loom train: the
// policy's optimizer (DataParallel at ZeRO 0-3 over the learner ranks, one rank in one
// process; an fp32 master under bf16 and fp16), the StepEngine that reduces, measures, clips
// and steps the gradients (fp16's loss scaler included), the bf16 GEMMs of a bf16 policy on an
// AVX512-BF16 CPU, and the frozen reference (frozen_copy_of, DPO's machinery). GRPO builds it
// around a policy it is handed rather than from a config: the loops own their Decoder.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "precision/policy.h"
#include "train/gemm_recipes.h"
#include "train/step_engine.h"
#include "train/train_setup.h"

namespace loom::rl {

struct LearnerEngineOptions {
  AdamWConfig adam;
  double clip_grad = 1.0;
  PrecisionPolicy precision;       // the policy's compute type (its Decoder's act_dtype)
  LossScaler::Options scaler;      // fp16
  int zero = 0;                    // parallel.zero over the learner ranks
  DType grad_reduce = DType::F32;  // parallel.grad_reduce_dtype
  bool reference = false;          // a frozen copy of the starting weights (grpo.beta > 0)
  bool quiet = true;               // no log line about the bf16 GEMMs
};

class LearnerEngine {
 public:
  // `policy` holds the starting weights in fp32 (under bf16 / fp16 still unrounded: they become
  // the master, and the policy's copy is rounded to the compute type here). `dp`: the learner
  // ranks that hold the same (TP, EP) shard (null: one learner); `expert_dp`: the ranks holding
  // the same experts (null: none other); `norm_group`: the ranks whose gradients are disjoint
  // parts of the whole (every learner rank; null: dp).
  LearnerEngine(Decoder& policy, const LearnerEngineOptions& opt, comm::Communicator* dp,
                comm::Communicator* expert_dp, comm::Communicator* norm_group);
  ~LearnerEngine();
  LearnerEngine(const LearnerEngine&) = delete;
  LearnerEngine& operator=(const LearnerEngine&) = delete;

  StepEngine& engine() { return *engine_; }
  parallel::DataParallel& optimizer() { return *dp_; }
  GemmRecipes& recipes() { return recipes_; }
  Decoder* reference() { return reference_.model.get(); }
  const PrecisionPolicy& precision() const { return precision_; }
  // After the policy's weights were written from outside (a resume): the bf16 GEMMs' copies
  // follow, the model's copy is re-derived from the master.
  void weights_restored();

 private:
  PrecisionPolicy precision_;
  // One learner: self communicators for the engine's groups.
  std::unique_ptr<comm::Communicator> self_dp_, self_edp_;
  std::unique_ptr<parallel::DataParallel> dp_;
  std::unique_ptr<StepEngine> engine_;
  GemmRecipes recipes_;
  FrozenReference reference_;                  // its shards go before dp_ (declared after)
  std::unique_ptr<Bf16Gemms> reference_bf16_;  // the reference's own bf16 GEMMs
};

}  // namespace loom::rl
