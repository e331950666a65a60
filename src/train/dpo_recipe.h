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
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "train/batch.h"
#include "train/dpo.h"
#include "train/train_setup.h"

namespace loom {

// Reads [dpo] (DpoOptions, dpo.h); DPO needs data.source = "preference". A key of another
// loss (dpo.simpo_gamma without dpo.loss = "simpo") is refused naming it.
DpoOptions dpo_options_from(const Config& cfg);

class DpoRecipe {
 public:
  // Pairs (kto: examples, their rewards by label) and their sums.
  struct Stats {
    double loss = 0, reward_chosen = 0, reward_rejected = 0, correct = 0;
    double nll = 0;  // simpo and orpo: the chosen NLL term, times the micro-batch's pairs
    double kl = 0;   // kto: the KL estimate z_0, times the micro-batch's examples
    int64_t pairs = 0;
    int64_t desirable = 0;  // kto: desirable examples (the rest are undesirable)
    // The figures a step or an evaluation reports (prefix "" or "valid_").
    std::vector<std::pair<std::string, double>> report(DpoLoss loss,
                                                       const std::string& prefix) const;
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
  DpoLoss loss() const { return opt_.loss; }
  // A micro-batch's figures from its sequences' log-probabilities (pi; ref empty for SimPO and
  // ORPO), reply token counts n and KTO's labels, and in `weight` each sequence's token loss
  // weight -dL/dpi_s, the loss being the step's: a mean over its pairs_in_step pairs (and, for
  // the NLL term, over its micro-batches).
  static Stats sequence_terms(const DpoOptions& o, const std::vector<double>& pi,
                              const std::vector<double>& ref, const std::vector<int64_t>& n,
                              const std::vector<int8_t>& labels, int64_t pairs_in_step,
                              std::vector<double>* weight);

 private:
  // `b` the whole micro-batch (its reply token counts and labels); `in` this rank's part.
  Stats terms(const Batch& b, const ModelInput& in, const StepOutputs& ref, const StepOutputs& pol,
              int64_t pairs_in_step, std::vector<float>& w) const;

  TrainSetup& s_;
  DpoOptions opt_;
  int64_t step_ = 0;  // the step gradients() runs (LoRA dropout's key under a pipeline)
};

}  // namespace loom
