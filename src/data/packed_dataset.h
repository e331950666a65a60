// Sequence packing: whole documents placed into rows of seq_len tokens, each document its own
// attention segment (cu_seqlens), positions restarting at 0 in every document, so nothing
// attends across documents. Documents longer than a row are cut into row-sized pieces.
//
// Order and determinism: documents are taken epoch by epoch in a seeded shuffle of the split;
// each goes to the first of the last `open_rows` unfinished rows with room for it (first fit
// over a window), so rows fill up without sorting the corpus. Rows are then shuffled.
// Targets: the next token within the same document; the last token of a document (or of a
// cut piece) and the padding at a row's end have target -1.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/sample_source.h"

namespace loom::data {

struct PackedDatasetConfig {
  std::string prefix;
  int seq_len = 1024;
  uint64_t seed = 1234;
  int64_t num_samples = 0;  // rows wanted; 0: one epoch's worth
  std::string split = "1,0,0";
  Split which = Split::Train;
  int open_rows = 64;
  int32_t pad_token = 0;
  bool log = true;
};

class PackedDataset : public SampleSource {
 public:
  explicit PackedDataset(PackedDatasetConfig cfg);
  PackedDataset(PackedDatasetConfig cfg, std::shared_ptr<const IndexedDataset> data);

  int64_t size() const override { return int64_t(order_.size()); }
  int seq_len() const override { return cfg_.seq_len; }
  void fill_row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                std::vector<int32_t>& seg_lens) const override;

  // Document tokens / (rows x seq_len) over all packed rows.
  double efficiency() const { return efficiency_; }
  int64_t num_epochs() const { return num_epochs_; }

  struct Segment {
    int32_t doc;
    int32_t offset, length;
  };
  // Segments of row i (after the shuffle), in placement order.
  std::vector<Segment> row_segments(int64_t i) const;

 private:
  PackedDatasetConfig cfg_;
  std::shared_ptr<const IndexedDataset> data_;
  std::vector<Segment> segments_;   // all rows' segments, row after row
  std::vector<int64_t> row_begin_;  // row r: segments_[row_begin_[r], row_begin_[r+1])
  std::vector<int64_t> order_;      // shuffled row ids
  double efficiency_ = 0;
  int64_t num_epochs_ = 0;
};

}  // namespace loom::data
