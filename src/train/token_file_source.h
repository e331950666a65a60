// Token data from Megatron-format .bin/.idx files through the data library's loader
// (GPT-dataset sampling, blending, optional packing, prefetch, resumable position).
#pragma once

#include <memory>

#include "data/loader.h"
#include "train/batch.h"

namespace loom {

class TokenFileSource : public BatchSource {
 public:
  TokenFileSource(const data::LoaderConfig& cfg, int vocab);
  void next(Batch& b) override;
  Json state() const override { return loader_->state(); }
  void restore(const Json& state) override { loader_->restore(state); }
  int vocab() const override { return vocab_; }
  std::string describe() const override;

 private:
  data::LoaderConfig cfg_;
  std::unique_ptr<data::Loader> loader_;
  data::Batch staging_;
  int vocab_;
};

}  // namespace loom
