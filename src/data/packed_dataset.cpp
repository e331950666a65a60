#include "data/packed_dataset.h"

#include <deque>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"

namespace loom::data {

PackedDataset::PackedDataset(PackedDatasetConfig cfg)
    : PackedDataset(cfg, std::make_shared<IndexedDataset>(cfg.prefix)) {}

PackedDataset::PackedDataset(PackedDatasetConfig cfg, std::shared_ptr<const IndexedDataset> data)
    : cfg_(std::move(cfg)), data_(std::move(data)) {
  const int32_t T = cfg_.seq_len;
  LOOM_CHECK(T > 0 && cfg_.open_rows > 0, "packing: seq_len and open_rows must be positive");
  auto b = split_boundaries(cfg_.split, data_->num_sequences());
  const int64_t d0 = b[size_t(cfg_.which)], d1 = b[size_t(cfg_.which) + 1];
  int64_t tokens_per_epoch = 0;
  for (int64_t d = d0; d < d1; ++d) tokens_per_epoch += data_->sequence_length(d);
  LOOM_CHECK(tokens_per_epoch > 0, cfg_.prefix, ": split '", cfg_.split,
             "' leaves no tokens to pack");

  struct OpenRow {
    std::vector<Segment> segs;
    int32_t used = 0;
  };
  std::deque<OpenRow> open;
  int64_t packed_tokens = 0;
  row_begin_ = {0};
  auto close_front = [&] {
    for (auto& s : open.front().segs) segments_.push_back(s);
    row_begin_.push_back(int64_t(segments_.size()));
    open.pop_front();
  };
  auto place = [&](Segment s) {
    for (auto& r : open) {
      if (r.used + s.length <= T) {
        r.segs.push_back(s);
        r.used += s.length;
        return;
      }
    }
    open.push_back(OpenRow{{s}, s.length});
    if (int(open.size()) > cfg_.open_rows) close_front();
  };
  const uint64_t key = name_key("packed_dataset/document_order");
  std::vector<int32_t> docs(static_cast<size_t>(d1 - d0));
  const int64_t wanted = cfg_.num_samples;
  while (num_epochs_ == 0 || int64_t(row_begin_.size() - 1 + open.size()) < wanted) {
    for (int64_t d = d0; d < d1; ++d) docs[size_t(d - d0)] = int32_t(d);
    shuffle_in_place(docs, 0, docs.size(), cfg_.seed, key + uint64_t(num_epochs_));
    for (int32_t d : docs) {
      int32_t len = data_->sequence_length(d);
      for (int32_t off = 0; off < len; off += T) place({d, off, std::min(T, len - off)});
      packed_tokens += len;
    }
    ++num_epochs_;
  }
  while (!open.empty()) close_front();
  const int64_t rows = int64_t(row_begin_.size()) - 1;
  efficiency_ = double(packed_tokens) / (double(rows) * T);
  order_.resize(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) order_[size_t(r)] = r;
  shuffle_in_place(order_, 0, order_.size(), cfg_.seed, name_key("packed_dataset/row_order"));
  if (cfg_.log)
    log_info(cfg_.prefix, ": packed ", d1 - d0, " documents x ", num_epochs_, " epoch(s) into ",
             rows, " rows of ", T, " tokens, efficiency ", int64_t(efficiency_ * 10000) / 100.0,
             "%");
}

std::vector<PackedDataset::Segment> PackedDataset::row_segments(int64_t i) const {
  LOOM_CHECK(i >= 0 && i < size(), "packed row ", i, " out of range (", size(), " rows)");
  int64_t r = order_[size_t(i)];
  return std::vector<Segment>(segments_.begin() + row_begin_[size_t(r)],
                              segments_.begin() + row_begin_[size_t(r) + 1]);
}

void PackedDataset::fill_row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                             std::vector<int32_t>& seg_lens) const {
  const int32_t T = cfg_.seq_len;
  int32_t t = 0;
  for (const Segment& s : row_segments(i)) {
    data_->read(s.doc, s.offset, s.length, tokens + t);
    for (int32_t k = 0; k < s.length; ++k) {
      positions[t + k] = k;
      targets[t + k] = k + 1 < s.length ? tokens[t + k + 1] : -1;
    }
    seg_lens.push_back(s.length);
    t += s.length;
  }
  if (t < T) {  // padding: its own segment, no loss
    for (int32_t k = t; k < T; ++k) {
      tokens[k] = cfg_.pad_token;
      targets[k] = -1;
      positions[k] = k - t;
    }
    seg_lens.push_back(T - t);
  }
}

}  // namespace loom::data
