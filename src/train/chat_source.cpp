#include "train/chat_source.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"

namespace loom {

ChatSource::ChatSource(const std::string& path, const std::string& tokenizer_spec,
                       const std::string& template_name, int micro_batch, int seq_len, bool packed,
                       uint64_t seed, double valid_fraction, const std::string& split, int rank,
                       int world)
    : path_(path),
      template_(template_name),
      B_(micro_batch),
      T_(seq_len),
      packed_(packed),
      seed_(seed),
      rank_(rank),
      world_(world),
      split_(split) {
  LOOM_CHECK(!tokenizer_spec.empty(), "data.source = \"chat\" needs data.tokenizer");
  LOOM_CHECK(valid_fraction >= 0 && valid_fraction < 1, "data.valid_fraction must be in [0, 1), ",
             "got ", valid_fraction);
  tok_ = data::load_tokenizer(tokenizer_spec);
  vocab_ = tok_->vocab_size();
  data::ChatTemplate t(template_name, *tok_);
  examples_ = data::load_chat_jsonl(path, t);
  select(static_cast<int64_t>(examples_.size()), valid_fraction);
  // Keep only this split's examples (indices then count from first_).
  examples_ = std::vector<data::ChatExample>(examples_.begin() + first_,
                                             examples_.begin() + first_ + count_);
  first_ = 0;
}

ChatSource::ChatSource(const std::string& token_prefix, int vocab, int micro_batch, int seq_len,
                       bool packed, uint64_t seed, double valid_fraction, const std::string& split,
                       int rank, int world)
    : path_(token_prefix),
      template_("as tokenized"),
      B_(micro_batch),
      T_(seq_len),
      packed_(packed),
      seed_(seed),
      rank_(rank),
      world_(world),
      split_(split) {
  LOOM_CHECK(valid_fraction >= 0 && valid_fraction < 1, "data.valid_fraction must be in [0, 1), ",
             "got ", valid_fraction);
  file_ = std::make_unique<data::ChatTokenFile>(token_prefix);
  vocab_ = vocab;
  select(file_->size(), valid_fraction);
}

void ChatSource::select(int64_t n, double valid_fraction) {
  int64_t held = static_cast<int64_t>(valid_fraction * n);
  if (valid_fraction > 0) held = std::max<int64_t>(1, held);
  LOOM_CHECK(held < n, path_, ": ", n, " examples leave none for training after holding out ", held,
             " for validation (data.valid_fraction)");
  first_ = split_ == "train" ? 0 : n - held;
  count_ = split_ == "train" ? n - held : held;
  LOOM_CHECK(count_ > 0, path_, ": no examples for the '", split_,
             "' split (raise data.valid_fraction)");
  order_ = std::make_unique<EpochOrder>(count_, seed_, /*shuffle=*/split_ == "train");
}

data::ChatExample ChatSource::example(int64_t i) const {
  if (!file_) return examples_[size_t(i)];
  data::ChatExample ex = file_->example(first_ + i);
  for (size_t k = 0; k < ex.ids.size(); ++k)
    LOOM_CHECK(ex.ids[k] >= 0 && ex.ids[k] < vocab_, path_, ".bin: example ", first_ + i,
               " holds token id ", ex.ids[k], " at position ", k, ", outside the vocabulary of ",
               vocab_);
  return ex;
}

void ChatSource::pack(Batch& b) {
  const int N = B_ * T_;
  b.B = packed_ ? 1 : B_;
  b.T = packed_ ? N : T_;
  b.tokens.assign(size_t(N), 0);
  b.targets.assign(size_t(N), -1);
  b.positions.assign(size_t(N), 0);
  b.cu_seqlens.assign(1, 0);
  int used = 0;
  auto place = [&](const data::ChatExample& ex, int room) {
    const int len = std::min<int>(static_cast<int>(ex.ids.size()), room);
    if (len < static_cast<int>(ex.ids.size())) ++truncated_;
    for (int i = 0; i < len; ++i) {
      b.tokens[size_t(used + i)] = ex.ids[size_t(i)];
      b.positions[size_t(used + i)] = i;
      if (i + 1 < len && ex.mask[size_t(i + 1)])
        b.targets[size_t(used + i)] = ex.ids[size_t(i + 1)];
    }
    used += len;
    b.cu_seqlens.push_back(used);
  };
  if (packed_) {
    // Greedy: examples in order while they fit whole; an example longer than the model's
    // context or a whole micro-batch is cut; the first that does not fit waits for the next
    // micro-batch.
    while (used < N) {
      const data::ChatExample ex = example(order_->next());
      const int len = std::min(static_cast<int>(ex.ids.size()), max_example_);
      if (used > 0 && len > N - used) {
        order_->put_back();
        break;
      }
      place(ex, std::min(N - used, max_example_));
    }
  } else {
    for (int r = 0; r < B_; ++r) {
      place(example(order_->next()), T_);
      const int pad = (r + 1) * T_ - used;  // the rest of the row: its own sequence
      if (pad > 0) {
        for (int i = 0; i < pad; ++i) b.positions[size_t(used + i)] = i;
        used += pad;
        b.cu_seqlens.push_back(used);
      }
    }
  }
  if (used < N) {  // padding: one sequence without targets
    for (int i = used; i < N; ++i) b.positions[size_t(i)] = i - used;
    b.cu_seqlens.push_back(N);
  }
}

void ChatSource::next(Batch& b) {
  // Rank r's micro-batch j is the one-process micro-batch j * world + r: every rank packs
  // every rank's micro-batch (cheap: copies of short id lists) and keeps its own.
  Batch other;
  for (int r = 0; r < world_; ++r) pack(r == rank_ ? b : other);
}

Json ChatSource::state() const {
  Json j = order_->state();
  j["truncated"] = truncated_;
  return j;
}

void ChatSource::restore(const Json& s) {
  order_->restore(s);
  truncated_ = s.at("truncated").as_int();
}

std::string ChatSource::describe() const {
  return cat(file_ ? "chat token files " : "chat ", path_, " (", count_, " ", split_,
             " examples, template ", template_, packed_ ? ", packed" : ", one per row", ")");
}

}  // namespace loom
