// Supervised fine-tuning batches from chat JSONL (data.source = "chat"): every example is
// rendered by the chat template (data/chat.h) and becomes its own sequence of a micro-batch,
// with targets only where the template trains (assistant turns or completions; -1 elsewhere).
// Packed (data.packed = true, default): examples are laid end to end in B*T tokens with
// cu_seqlens between them (no attention across examples; Megatron's packed fine-tuning),
// the rest padded; unpacked: one example per row of T tokens. Longer examples are cut to T
// (counted). Order: a permutation per epoch from the counter-based RNG (seed, epoch), so the
// source is deterministic and resumable; the last data.valid_fraction of the file (at least
// one example) is held out for validation.
//
// The examples come from chat JSONL (parsed and held whole), or from chat token files
// (data/chat_tokens.h: `loom tokenize --chat`), read from memory-mapped files as they are
// packed; the same examples give the same batches either way.
#pragma once

#include <cstdint>

#include <memory>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/chat.h"
#include "data/chat_tokens.h"
#include "train/batch.h"
#include "train/epoch_order.h"

namespace loom {

class ChatSource : public BatchSource {
 public:
  ChatSource(const std::string& path, const std::string& tokenizer_spec,
             const std::string& template_name, int micro_batch, int seq_len, bool packed,
             uint64_t seed, double valid_fraction, const std::string& split, int rank = 0,
             int world = 1);

  // From chat token files PREFIX.{bin,idx} + PREFIX.mask.{bin,idx}; ids must lie below
  // `vocab` (the tokenizer's, or the model's).
  ChatSource(const std::string& token_prefix, int vocab, int micro_batch, int seq_len, bool packed,
             uint64_t seed, double valid_fraction, const std::string& split, int rank = 0,
             int world = 1);

  void next(Batch& b) override;
  Json state() const override;
  void restore(const Json& state) override;
  int vocab() const override { return vocab_; }
  std::string describe() const override;
  int64_t truncated() const { return truncated_; }
  // The longest example a micro-batch holds, in tokens: positions restart at 0 in each packed
  // example, so the model's context (model.max_seq) bounds one, not micro_batch x seq_len. A
  // longer example is cut there and counted in truncated().
  void limit_example_tokens(int max_tokens) { max_example_ = max_tokens; }

 private:
  // The split's examples [first, first + count) of `total`, and the epoch order over them.
  void select(int64_t total, double valid_fraction);
  // The next micro-batch of the one-process order into b (advances the cursor).
  void pack(Batch& b);
  // Example i of this split.
  data::ChatExample example(int64_t i) const;

  std::unique_ptr<data::BpeTokenizer> tok_;
  std::vector<data::ChatExample> examples_;    // JSONL: this split's
  std::unique_ptr<data::ChatTokenFile> file_;  // token files: every example
  int64_t first_ = 0, count_ = 0;              // this split's examples (of the file's)
  int vocab_ = 0;
  std::string path_, template_;
  int B_, T_;
  bool packed_;
  uint64_t seed_;
  int rank_, world_;
  std::unique_ptr<EpochOrder> order_;
  int64_t truncated_ = 0;
  int max_example_ = INT32_MAX;
  std::string split_;
};

}  // namespace loom
