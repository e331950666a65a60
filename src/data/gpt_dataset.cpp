#include "data/gpt_dataset.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/npy.h"

namespace loom::data {

uint64_t random_below(uint64_t seed, uint64_t key, uint64_t counter, uint64_t n) {
  auto w = philox(seed, key, counter);
  uint64_t r = (uint64_t(w[0]) << 32) | w[1];
  return uint64_t((static_cast<unsigned __int128>(r) * n) >> 64);
}

std::vector<int64_t> split_boundaries(const std::string& split, int64_t n) {
  std::vector<double> w;
  size_t pos = 0;
  while (pos <= split.size()) {
    size_t comma = split.find(',', pos);
    if (comma == std::string::npos) comma = split.size();
    std::string part = split.substr(pos, comma - pos);
    char* end = nullptr;
    double v = std::strtod(part.c_str(), &end);
    LOOM_CHECK(!part.empty() && *end == 0 && v >= 0, "split '", split,
               "': expected up to three non-negative weights like 969,30,1");
    w.push_back(v);
    pos = comma + 1;
  }
  LOOM_CHECK(w.size() <= 3, "split '", split, "' has more than three parts");
  w.resize(3, 0.0);
  double sum = w[0] + w[1] + w[2];
  LOOM_CHECK(sum > 0, "split '", split, "' has no positive weight");
  std::vector<int64_t> b = {0};
  for (double x : w) b.push_back(b.back() + int64_t(std::nearbyint(x / sum * double(n))));
  int64_t diff = b.back() - n;
  for (size_t i = 1; i < b.size(); ++i) b[i] -= diff;
  return b;
}

GptDataset::GptDataset(GptDatasetConfig cfg)
    : GptDataset(cfg, std::make_shared<IndexedDataset>(cfg.prefix)) {}

GptDataset::GptDataset(GptDatasetConfig cfg, std::shared_ptr<const IndexedDataset> data)
    : cfg_(std::move(cfg)), data_(std::move(data)) {
  LOOM_CHECK(cfg_.seq_len > 0, "seq_len must be positive");
  auto b = split_boundaries(cfg_.split, data_->num_sequences());
  doc_begin_ = b[size_t(cfg_.which)];
  doc_end_ = b[size_t(cfg_.which) + 1];
  static const char* names[] = {"train", "valid", "test"};
  LOOM_CHECK(doc_end_ > doc_begin_, cfg_.prefix, ": split '", cfg_.split,
             "' leaves no documents for ", names[int(cfg_.which)], " (", data_->num_sequences(),
             " documents in total)");
  for (int64_t d = doc_begin_; d < doc_end_; ++d) tokens_per_epoch_ += data_->sequence_length(d);
  LOOM_CHECK(tokens_per_epoch_ > cfg_.seq_len, cfg_.prefix, ": the ", names[int(cfg_.which)],
             " split has ", tokens_per_epoch_,
             " tokens, fewer than one sample of seq_len + 1 = ", cfg_.seq_len + 1);

  // Everything the indices depend on names the cache files.
  Json desc = Json::object();
  desc["class"] = "GPTDataset";
  desc["version"] = 1;
  desc["prefix"] = std::filesystem::absolute(cfg_.prefix).lexically_normal().string();
  desc["num_sequences"] = data_->num_sequences();
  desc["num_tokens"] = uint64_t(data_->num_tokens());
  desc["split"] = cfg_.split;
  desc["split_index"] = int(cfg_.which);
  desc["seq_len"] = cfg_.seq_len;
  desc["seed"] = uint64_t(cfg_.seed);
  desc["num_samples"] = cfg_.num_samples;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)name_key(desc.dump()));
  key_ = hex;

  std::string dir = cfg_.cache_dir;
  if (dir.empty()) {
    std::string parent = std::filesystem::path(cfg_.prefix).parent_path().string();
    dir = (parent.empty() ? std::string(".") : parent) + "/cache/GPTDataset_indices";
  }
  const std::string base = dir + "/" + key_ + "-GPTDataset-";
  const std::string f_doc = base + "document_index.npy", f_sample = base + "sample_index.npy",
                    f_shuffle = base + "shuffle_index.npy", f_desc = base + "description.json";
  if (cfg_.use_cache && file_exists(f_desc) && file_exists(f_doc) && file_exists(f_sample) &&
      file_exists(f_shuffle)) {
    std::vector<int64_t> shape;
    document_index_ = read_npy_i32(f_doc, &shape);
    sample_index_ = read_npy_i32(f_sample, &shape);
    LOOM_CHECK(shape.size() == 2 && shape[1] == 2, f_sample, ": expected shape (n, 2)");
    shuffle_index_ = read_npy_i64(f_shuffle, &shape);
    Json d = Json::parse(read_file(f_desc), f_desc);
    num_epochs_ = d.at("num_epochs").as_int();
    from_cache_ = true;
    LOOM_CHECK(sample_index_.size() == 2 * (shuffle_index_.size() + 1), f_shuffle,
               ": does not match ", f_sample, " (delete the cache folder to rebuild)");
    return;
  }
  double t0 = now_seconds();
  build();
  if (cfg_.use_cache) {
    try {
      make_dirs(dir);
      write_npy(f_doc, document_index_, {int64_t(document_index_.size())});
      write_npy(f_sample, sample_index_, {int64_t(sample_index_.size() / 2), 2});
      write_npy(f_shuffle, shuffle_index_, {int64_t(shuffle_index_.size())});
      desc["num_epochs"] = num_epochs_;
      desc["num_samples_available"] = int64_t(shuffle_index_.size());
      write_file_atomic(f_desc, desc.dump(2) + "\n");  // last: marks the set complete
    } catch (const Error& e) {  // e.g. a read-only data folder: the indices still work
      log_warn("cannot cache dataset indices (", e.what(), "); rebuilding them each run");
    }
  }
  if (cfg_.log)
    log_info(cfg_.prefix, " [", names[int(cfg_.which)], "]: ", doc_end_ - doc_begin_,
             " documents, ", tokens_per_epoch_, " tokens/epoch, ", num_epochs_, " epoch(s), ",
             size(), " samples of ", cfg_.seq_len, " (indices built in ",
             int64_t((now_seconds() - t0) * 1000), " ms)");
}

void GptDataset::build() {
  const int64_t T = cfg_.seq_len, n_docs = doc_end_ - doc_begin_;
  // Megatron's _get_num_epochs (one extra token for the last target).
  int64_t wanted = cfg_.num_samples;
  num_epochs_ = 1;
  if (wanted > 0) {
    while (num_epochs_ * tokens_per_epoch_ < wanted * T + 1) ++num_epochs_;
  }
  LOOM_CHECK(num_epochs_ * n_docs < INT32_MAX, cfg_.prefix, ": document index too large");
  bool separate_final = false;
  if (num_epochs_ > 1) {
    int64_t sans_final = ((num_epochs_ - 1) * tokens_per_epoch_ - 1) / T;
    int64_t from_final = wanted - sans_final;
    int64_t per_epoch = (tokens_per_epoch_ - 1) / T;
    separate_final = from_final < int64_t(0.8 * double(per_epoch));
  }

  const uint64_t key_doc = name_key("gpt_dataset/document_index");
  const uint64_t key_doc_last = name_key("gpt_dataset/document_index/final_epoch");
  const uint64_t key_shuffle = name_key("gpt_dataset/shuffle_index");
  const uint64_t key_shuffle_last = name_key("gpt_dataset/shuffle_index/final_epoch");
  document_index_.resize(size_t(num_epochs_ * n_docs));
  for (int64_t e = 0; e < num_epochs_; ++e)
    for (int64_t d = 0; d < n_docs; ++d)
      document_index_[size_t(e * n_docs + d)] = int32_t(doc_begin_ + d);
  size_t first_part = separate_final ? size_t((num_epochs_ - 1) * n_docs) : document_index_.size();
  shuffle_in_place(document_index_, 0, first_part, cfg_.seed, key_doc);
  if (separate_final)
    shuffle_in_place(document_index_, first_part, document_index_.size(), cfg_.seed, key_doc_last);

  // Megatron's build_sample_idx with drop_last_partial_sequence and add_extra_token = 1.
  const int64_t n_samples = (num_epochs_ * tokens_per_epoch_ - 1) / T;
  sample_index_.assign(size_t(2 * (n_samples + 1)), 0);
  int64_t doc_pos = 0, offset = 0;
  for (int64_t s = 1; s <= n_samples; ++s) {
    int64_t remaining = T + 1;
    while (remaining != 0) {
      int64_t doc_len = data_->sequence_length(document_index_[size_t(doc_pos)]) - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        offset += remaining + doc_len - 1;
        remaining = 0;
      } else {
        ++doc_pos;
        LOOM_CHECK(doc_pos < int64_t(document_index_.size()), "internal: sample index overran");
        offset = 0;
      }
    }
    sample_index_[size_t(2 * s)] = int32_t(doc_pos);
    sample_index_[size_t(2 * s + 1)] = int32_t(offset);
  }

  shuffle_index_.resize(size_t(n_samples));
  for (int64_t i = 0; i < n_samples; ++i) shuffle_index_[size_t(i)] = i;
  size_t sans_final = separate_final ? size_t(((num_epochs_ - 1) * tokens_per_epoch_ - 1) / T)
                                     : shuffle_index_.size();
  shuffle_in_place(shuffle_index_, 0, sans_final, cfg_.seed, key_shuffle);
  if (separate_final)
    shuffle_in_place(shuffle_index_, sans_final, shuffle_index_.size(), cfg_.seed,
                     key_shuffle_last);
}

void GptDataset::sample_tokens(int64_t j, int32_t* out) const {
  LOOM_CHECK(j >= 0 && j < size(), "sample ", j, " out of range (", size(), " samples)");
  int64_t beg = sample_index_[size_t(2 * j)], beg_off = sample_index_[size_t(2 * j + 1)];
  int64_t end = sample_index_[size_t(2 * j + 2)], end_off = sample_index_[size_t(2 * j + 3)];
  if (beg == end) {
    data_->read(document_index_[size_t(beg)], beg_off, end_off - beg_off + 1, out);
    return;
  }
  int64_t n = 0;
  for (int64_t p = beg; p <= end; ++p) {
    int32_t doc = document_index_[size_t(p)];
    int64_t from = p == beg ? beg_off : 0;
    int64_t to = p == end ? end_off + 1 : data_->sequence_length(doc);
    data_->read(doc, from, to - from, out + n);
    n += to - from;
  }
}

void GptDataset::fill_row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                          std::vector<int32_t>& seg_lens) const {
  const int T = cfg_.seq_len;
  std::vector<int32_t> buf(static_cast<size_t>(T) + 1);
  sample_tokens(shuffle_index_[size_t(i)], buf.data());
  for (int t = 0; t < T; ++t) {
    tokens[t] = buf[size_t(t)];
    targets[t] = buf[size_t(t) + 1];
    positions[t] = t;
  }
  seg_lens.push_back(T);
}

}  // namespace loom::data
