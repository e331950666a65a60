#include "train/preference_source.h"

#include <algorithm>

#include "core/error.h"
#include "core/fs.h"
#include "core/jsonl.h"
#include "core/log.h"

namespace loom {
namespace {

// True when none of the example's trained tokens has a target inside a row of seq_len tokens:
// the reply is cut away entirely.
bool reply_cut_away(const data::ChatExample& ex, int seq_len) {
  const size_t n = std::min(ex.mask.size(), size_t(seq_len));
  for (size_t i = 1; i < n; ++i)
    if (ex.mask[i]) return false;
  return true;
}

}  // namespace

PreferenceSource::PreferenceSource(const std::string& path, const std::string& tokenizer_spec,
                                   const std::string& template_name, int pairs_per_batch,
                                   int seq_len, uint64_t seed, double valid_fraction,
                                   const std::string& split, int rank, int world, bool unpaired)
    : unpaired_(unpaired),
      path_(path),
      template_(template_name),
      split_(split),
      B_(pairs_per_batch),
      T_(seq_len),
      rank_(rank),
      world_(world) {
  LOOM_CHECK(!tokenizer_spec.empty(), "data.source = \"preference\" needs data.tokenizer");
  tok_ = data::load_tokenizer(tokenizer_spec);
  chat_ = std::make_unique<data::ChatTemplate>(template_name, *tok_);
  const data::ChatTemplate& t = *chat_;
  std::vector<Pair> all;
  int64_t identical = 0, cut_away = 0, desirable = 0;
  std::string first_identical, first_cut_away;
  for_each_jsonl(path, [&](const Json& j, const std::string& where) {
    if (unpaired_) {
      LOOM_CHECK(
          j.is_object() && j.contains("prompt") && j.contains("completion") && j.contains("label"),
          where, ": expected 'prompt', 'completion' and 'label' (dpo.loss = \"kto\")");
      LOOM_CHECK(j.at("label").type() == Json::Type::Bool, where,
                 ": 'label' must be true (desirable) or false (undesirable)");
      Pair p;
      p.prompt = data::chat_messages_of(j.at("prompt"), "user", where, "prompt");
      p.completion = data::chat_messages_of(j.at("completion"), "assistant", where, "completion");
      LOOM_CHECK(p.completion.back().role == "assistant", where,
                 ": 'completion' must end with an assistant reply");
      p.desirable = j.at("label").as_bool();
      desirable += p.desirable;
      std::vector<data::ChatMessage> conv = p.prompt;
      conv.insert(conv.end(), p.completion.begin(), p.completion.end());
      p.chosen = t.render(conv);
      if (reply_cut_away(p.chosen, T_) && cut_away++ == 0) first_cut_away = where;
      all.push_back(std::move(p));
      return;
    }
    LOOM_CHECK(
        j.is_object() && j.contains("prompt") && j.contains("chosen") && j.contains("rejected"),
        where, ": expected 'prompt', 'chosen' and 'rejected'");
    std::vector<data::ChatMessage> prompt =
        data::chat_messages_of(j.at("prompt"), "user", where, "prompt");
    Pair p;
    for (int which = 0; which < 2; ++which) {
      const char* field = which == 0 ? "chosen" : "rejected";
      std::vector<data::ChatMessage> conv = prompt;
      for (auto& m : data::chat_messages_of(j.at(field), "assistant", where, field))
        conv.push_back(m);
      LOOM_CHECK(conv.back().role == "assistant", where, ": '", field,
                 "' must end with an assistant reply");
      (which == 0 ? p.chosen : p.rejected) = t.render(conv);
    }
    if (p.chosen.ids == p.rejected.ids && identical++ == 0) first_identical = where;
    if ((reply_cut_away(p.chosen, T_) || reply_cut_away(p.rejected, T_)) && cut_away++ == 0)
      first_cut_away = where;
    all.push_back(std::move(p));
  });
  const int64_t n = static_cast<int64_t>(all.size());
  LOOM_CHECK(n > 0, path, ": no preference pairs");
  if (unpaired_) {
    LOOM_CHECK(B_ >= 2, "dpo.loss = \"kto\" needs train.micro_batch >= 2 (its KL estimate pairs ",
               "each prompt with another example's completion), got ", B_);
    if (rank_ == 0 && split == "train" && (desirable == 0 || desirable == n))
      log_warn(path, ": every one of the ", n, " examples is ",
               desirable == n ? "desirable" : "undesirable",
               ": KTO learns from both kinds (dpo.desirable_weight, dpo.undesirable_weight)");
  }
  // Pairs that teach nothing: both sides alike, or a side with no reply token in the row.
  LOOM_CHECK(identical < n, path, ": every one of the ", n,
             " pairs has 'chosen' equal to 'rejected': no preference to learn");
  if (rank_ == 0 && split == "train") {
    if (identical > 0)
      log_warn(path, ": ", identical, " of ", n, " pairs have 'chosen' equal to 'rejected' (first ",
               first_identical, "): they carry no preference and add nothing to the gradient");
    if (cut_away > 0)
      log_warn(path, ": ", cut_away, " of ", n, " pairs have a prompt so long that a whole reply ",
               "falls past train.seq_len ", T_, " (first ", first_cut_away,
               "): their DPO term compares nothing; raise train.seq_len or shorten the prompts");
  }
  LOOM_CHECK(valid_fraction >= 0 && valid_fraction < 1, "data.valid_fraction must lie in [0, 1)");
  int64_t held = static_cast<int64_t>(valid_fraction * n);
  if (valid_fraction > 0) held = std::max<int64_t>(1, held);
  LOOM_CHECK(held < n, path, ": ", n, " pairs leave none for training");
  if (split == "train")
    pairs_.assign(all.begin(), all.end() - held);
  else
    pairs_.assign(all.end() - held, all.end());
  LOOM_CHECK(!pairs_.empty(), path, ": no pairs for the '", split, "' split");
  order_ =
      std::make_unique<EpochOrder>(static_cast<int64_t>(pairs_.size()), seed, split == "train");
}

void PreferenceSource::put(Batch& b, int r, const data::ChatExample& ex) {
  const size_t row = size_t(r) * T_;
  const int len = std::min<int>(static_cast<int>(ex.ids.size()), T_);
  truncated_ += len < static_cast<int>(ex.ids.size());
  b.lengths[size_t(r)] = len;
  for (int i = 0; i < len; ++i) {
    b.tokens[row + i] = ex.ids[size_t(i)];
    if (i + 1 < len && ex.mask[size_t(i + 1)]) b.targets[row + i] = ex.ids[size_t(i + 1)];
  }
}

void PreferenceSource::fill(Batch& b) {
  b.set_rows(2 * B_, T_);
  std::fill(b.tokens.begin(), b.tokens.end(), 0);
  std::fill(b.targets.begin(), b.targets.end(), -1);
  b.labels.clear();
  b.lengths.assign(size_t(2 * B_), 0);
  std::vector<const Pair*> taken;
  for (int k = 0; k < B_; ++k) {
    const Pair& p = pairs_[size_t(order_->next())];
    taken.push_back(&p);
    put(b, 2 * k, p.chosen);
    if (!unpaired_) put(b, 2 * k + 1, p.rejected);
  }
  if (!unpaired_) return;
  // Example k's prompt with example (k - 1) mod B's completion (TRL's rotation by one).
  for (int k = 0; k < B_; ++k) {
    const Pair& p = *taken[size_t(k)];
    const Pair& other = *taken[size_t((k + B_ - 1) % B_)];
    std::vector<data::ChatMessage> conv = p.prompt;
    conv.insert(conv.end(), other.completion.begin(), other.completion.end());
    put(b, 2 * k + 1, chat_->render(conv));
    b.labels.push_back(p.desirable ? 1 : 0);
  }
}

void PreferenceSource::next(Batch& b) {
  Batch other;
  for (int r = 0; r < world_; ++r) fill(r == rank_ ? b : other);
}

Json PreferenceSource::state() const {
  Json j = order_->state();
  j["truncated"] = truncated_;
  return j;
}

void PreferenceSource::restore(const Json& s) {
  order_->restore(s);
  truncated_ = s.at("truncated").as_int();
}

std::string PreferenceSource::describe() const {
  if (unpaired_)
    return cat("KTO examples ", path_, " (", pairs_.size(), " ", split_, " examples, template ",
               template_, ", ", B_, " examples + ", B_, " mismatched = ", 2 * B_,
               " rows per micro-batch)");
  return cat("preference pairs ", path_, " (", pairs_.size(), " ", split_, " pairs, template ",
             template_, ", ", B_, " pairs = ", 2 * B_, " rows per micro-batch)");
}

}  // namespace loom
