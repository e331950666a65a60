// GPT pretraining samples over a Megatron indexed dataset, with Megatron-Core's GPTDataset
// semantics:
//   - documents are the indexed file's sequences; a split ("969,30,1", by document count, as
//     Megatron rounds it) selects a contiguous range of them;
//   - document index: the split's documents repeated for as many epochs as num_samples needs,
//     shuffled with the seed (a last epoch that is used for less than 80% of its samples is
//     shuffled separately, so the earlier epochs see each document exactly once);
//   - sample index: sample j covers seq_len + 1 tokens of that stream, crossing document
//     boundaries; consecutive samples share one token (input j = tokens[:-1], targets =
//     tokens[1:]), so every token is a target once per epoch;
//   - shuffle index: a seeded permutation of the samples.
// The three indices are cached as .npy files next to the data (or in cache_dir), named by a
// hash of everything they depend on. Shuffles use Loom's counter-based RNG, not NumPy's
// Mersenne Twister, so the orders differ from Megatron's while the semantics are the same.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/sample_source.h"

namespace loom::data {

enum class Split { Train = 0, Valid = 1, Test = 2 };

// Megatron's get_split_indices: document boundaries [b0=0, b1, b2, b3=n] for "a,b,c".
std::vector<int64_t> split_boundaries(const std::string& split, int64_t num_documents);

struct GptDatasetConfig {
  std::string prefix;  // PREFIX.bin / PREFIX.idx
  int seq_len = 1024;
  uint64_t seed = 1234;
  int64_t num_samples = 0;  // samples wanted; 0: exactly one epoch
  std::string split = "1,0,0";
  Split which = Split::Train;
  std::string cache_dir;  // default: <prefix's folder>/cache/GPTDataset_indices
  bool use_cache = true;
  bool log = true;
};

class GptDataset : public SampleSource {
 public:
  explicit GptDataset(GptDatasetConfig cfg);
  GptDataset(GptDatasetConfig cfg, std::shared_ptr<const IndexedDataset> data);

  int64_t size() const override { return int64_t(shuffle_index_.size()); }
  int seq_len() const override { return cfg_.seq_len; }
  void fill_row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                std::vector<int32_t>& seg_lens) const override;

  // The seq_len + 1 tokens of sample j in stream order (before the shuffle index).
  void sample_tokens(int64_t j, int32_t* out) const;
  int64_t num_epochs() const { return num_epochs_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  int64_t first_document() const { return doc_begin_; }
  int64_t end_document() const { return doc_end_; }
  const std::vector<int32_t>& document_index() const { return document_index_; }
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }
  const IndexedDataset& data() const { return *data_; }
  const std::string& cache_key() const { return key_; }
  bool loaded_from_cache() const { return from_cache_; }

 private:
  void build();
  GptDatasetConfig cfg_;
  std::shared_ptr<const IndexedDataset> data_;
  int64_t doc_begin_ = 0, doc_end_ = 0, tokens_per_epoch_ = 0, num_epochs_ = 0;
  std::vector<int32_t> document_index_;
  std::vector<int32_t> sample_index_;  // (position in document_index, offset) pairs
  std::vector<int64_t> shuffle_index_;
  std::string key_;
  bool from_cache_ = false;
};

}  // namespace loom::data
