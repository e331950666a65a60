// DPO (train.mode = "dpo") over the step engine: each micro-batch of preference pairs runs
// forward through the frozen reference (TrainSetup::reference; under LoRA the base with the
// adapters detached) and the policy, the pairs' DPO terms become per-token loss weights, and the
// policy's backward with those weights accumulates the step's gradients. Over data-parallel
// ranks a micro-batch's pairs stay together on one rank (the sources deal out whole
// micro-batches), so only the sums cross ranks; tensor-parallel ranks compute the same terms
// (the vocabulary-parallel cross-entropy gives each every token's whole log-probability); under
// context parallelism the sequence log-probabilities are summed over the CP group; under a
// pipeline the last stage computes the terms.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "train/batch.h"
#include "train/dpo.h"
#include "train/train_setup.h"

namespace loom {

struct DpoOptions {
  double beta = 0.1;                // dpo.beta
  DpoLoss loss = DpoLoss::Sigmoid;  // dpo.loss: sigmoid, ipo or hinge
};
// Reads [dpo]; DPO needs data.source = "preference".
DpoOptions dpo_options_from(const Config& cfg);

class DpoRecipe {
 public:
  struct Stats {
    double loss = 0, reward_chosen = 0, reward_rejected = 0, correct = 0;
    int64_t pairs = 0;
    Stats& operator+=(const Stats& o);
    void all_reduce(comm::Communicator& g);  // summed over g
  };
  DpoRecipe(TrainSetup& s, const DpoOptions& o) : s_(s), opt_(o) {}

  // Step `step`'s gradients through the engine: its micro-batches read from `data` into
  // `micro_batches`; the figures summed over the global batch (every DP rank's pairs).
  Stats gradients(std::vector<Batch>& micro_batches, BatchSource& data, int64_t step);
  // `batches` held-out micro-batches of `valid`, forward only.
  Stats evaluate(BatchSource& valid, int batches);
  // One micro-batch of pairs: their DPO losses (summed) and statistics; with `backward`, the
  // policy's gradients of the loss scaled by 1 / pairs_in_step.
  Stats micro(const Batch& b, bool backward, int64_t pairs_in_step);
  // The same for a pipeline's micro-batches together (every pipeline rank; the figures summed
  // over the pipeline).
  Stats pipeline(std::vector<Batch>& batches, bool backward, int64_t pairs_in_step);
  // The MoE auxiliary loss's weight per token of a pass (ModelInput::aux_weight).
  float aux_weight(const ModelInput& in) const;

 private:
  Stats terms(const ModelInput& in, const StepOutputs& ref, const StepOutputs& pol,
              int64_t pairs_in_step, std::vector<float>& w) const;

  TrainSetup& s_;
  DpoOptions opt_;
  int64_t step_ = 0;  // the step gradients() runs (LoRA dropout's key under a pipeline)
};

}  // namespace loom
