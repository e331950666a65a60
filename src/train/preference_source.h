// Preference pairs for DPO (data.source = "preference"): JSONL lines {"prompt", "chosen",
// "rejected"}, each a string or a list of chat messages (the prompt's messages, and the chosen
// and rejected replies as assistant turns), rendered by the chat template. A micro-batch of B
// pairs is 2B rows of T tokens: row 2k the prompt with the chosen reply, row 2k + 1 with the
// rejected one, targets only on the reply (and its end of turn). Order, resume, data-parallel
// split and validation split as ChatSource's.
// Unpaired (KTO, dpo.loss = "kto"): lines {"prompt", "completion", "label"} (label true for a
// desirable completion, false for an undesirable one). A micro-batch of B examples is 2B rows:
// row 2k example k, row 2k + 1 example k's prompt with example (k - 1) mod B's completion (TRL's
// mismatched pairs for the KL estimate); Batch::labels holds the B labels. B must be >= 2.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/chat.h"
#include "train/batch.h"
#include "train/epoch_order.h"

namespace loom {

class PreferenceSource : public BatchSource {
 public:
  PreferenceSource(const std::string& path, const std::string& tokenizer_spec,
                   const std::string& template_name, int pairs_per_batch, int seq_len,
                   uint64_t seed, double valid_fraction, const std::string& split, int rank = 0,
                   int world = 1, bool unpaired = false);
  void next(Batch& b) override;
  Json state() const override;
  void restore(const Json& state) override;
  int vocab() const override { return tok_->vocab_size(); }
  std::string describe() const override;
  int64_t truncated() const { return truncated_; }

 private:
  struct Pair {
    data::ChatExample chosen, rejected;  // unpaired: chosen = the example, rejected unused
    // Unpaired: the prompt's and the completion's messages (for the mismatched rows), the label.
    std::vector<data::ChatMessage> prompt, completion;
    bool desirable = true;
  };
  void fill(Batch& b);
  void put(Batch& b, int row, const data::ChatExample& ex);
  std::unique_ptr<data::BpeTokenizer> tok_;
  std::unique_ptr<data::ChatTemplate> chat_;
  bool unpaired_ = false;
  std::vector<Pair> pairs_;
  std::string path_, template_, split_;
  int B_, T_, rank_, world_;
  std::unique_ptr<EpochOrder> order_;
  int64_t truncated_ = 0;
};

}  // namespace loom
