#include "train/token_file_source.h"

#include "core/error.h"

namespace loom {

TokenFileSource::TokenFileSource(const data::LoaderConfig& cfg, int vocab)
    : cfg_(cfg), loader_(std::make_unique<data::Loader>(cfg)), vocab_(vocab) {}

void TokenFileSource::next(Batch& b) {
  loader_->next(staging_);
  b.B = staging_.B;
  b.T = staging_.T;
  b.tokens.swap(staging_.tokens);
  b.targets.swap(staging_.targets);
  b.positions.swap(staging_.positions);
  b.cu_seqlens.swap(staging_.cu_seqlens);
  for (int32_t t : b.tokens)
    LOOM_CHECK(t >= 0 && t < vocab_, "token id ", t, " in ", cfg_.prefixes.front(),
               " is outside the model's vocabulary of ", vocab_,
               " (was the data tokenized with another vocabulary?)");
}

std::string TokenFileSource::describe() const {
  std::string p;
  for (auto& s : cfg_.prefixes) p += (p.empty() ? "" : ", ") + s;
  return cat("token files ", p, ": ", loader_->dataset_size(), " samples of ", cfg_.seq_len,
             " tokens",
             cfg_.packed ? cat(", packed (efficiency ", loader_->packing_efficiency(), ")")
                         : std::string());
}

}  // namespace loom
