// Reward models (train.mode = "reward") over the step engine: the decoder with a scalar value
// head (model.value_head: score.weight [1, d_model] on the final norm's output, as Hugging
// Face's AutoModelForSequenceClassification with num_labels = 1) scores each sequence at its last
// token, and preference pairs (data.source = "preference", the JSONL of DPO) train it with the
// Bradley-Terry loss of TRL's RewardTrainer:
//   L = -log sigmoid(r_c - r_r)          (r the scores of the chosen and rejected conversations)
// averaged over the step's pairs; accuracy counts pairs with r_c > r_r. Per micro-batch one
// forward for the scores, then one backward whose value gradients are dL/dr. Data parallelism
// keeps a micro-batch's pairs on one rank (as DPO); tensor, pipeline, context and expert
// parallelism and LoRA are refused.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/batch.h"
#include "train/train_setup.h"

namespace loom {

class RewardRecipe {
 public:
  struct Stats {
    double loss = 0, reward_chosen = 0, reward_rejected = 0, correct = 0;
    int64_t pairs = 0;
    Stats& operator+=(const Stats& o);
    void all_reduce(comm::Communicator& g);  // summed over g
    std::vector<std::pair<std::string, double>> report(const std::string& prefix) const;
  };
  explicit RewardRecipe(TrainSetup& s);

  // Step `step`'s gradients through the engine (the figures summed over every DP rank's pairs).
  Stats gradients(std::vector<Batch>& micro_batches, BatchSource& data, int64_t step);
  // `batches` held-out micro-batches of `valid`, forward only.
  Stats evaluate(BatchSource& valid, int batches);
  // One micro-batch of pairs (rows 2k chosen, 2k + 1 rejected); with `backward`, the gradients of
  // its loss over pairs_in_step.
  Stats micro(const Batch& b, bool backward, int64_t pairs_in_step);
  // The Bradley-Terry terms of a micro-batch's scores (2 per pair) and, in `grad`, each score's
  // dL/dr for a loss averaged over pairs_in_step pairs.
  static Stats pair_terms(const std::vector<double>& scores, int64_t pairs_in_step,
                          std::vector<float>* grad);

 private:
  TrainSetup& s_;
};

// The row of each sequence's last token (its length - 1; a sequence with no token counts its
// first row), for ModelInput::value_rows.
std::vector<int32_t> last_token_rows(const Batch& b);

}  // namespace loom
