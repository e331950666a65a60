// Preference pairs for DPO (data.source = "preference"): JSONL lines {"prompt", "chosen",
// "rejected"}, each a string or a list of chat messages (the prompt's messages, and the chosen
// and rejected replies as assistant turns), rendered by the chat template. A micro-batch of B
// pairs is 2B rows of T tokens: row 2k the prompt with the chosen reply, row 2k + 1 with the
// rejected one, targets only on the reply (and its end of turn). Order, resume, data-parallel
// split and validation split as ChatSource's.
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
                   int world = 1);
  void next(Batch& b) override;
  Json state() const override;
  void restore(const Json& state) override;
  int vocab() const override { return tok_->vocab_size(); }
  std::string describe() const override;
  int64_t truncated() const { return truncated_; }

 private:
  struct Pair {
    data::ChatExample chosen, rejected;
  };
  void fill(Batch& b);
  std::unique_ptr<data::BpeTokenizer> tok_;
  std::vector<Pair> pairs_;
  std::string path_, template_, split_;
  int B_, T_, rank_, world_;
  std::unique_ptr<EpochOrder> order_;
  int64_t truncated_ = 0;
};

}  // namespace loom
