// Weighted blending of several sample sources, with Megatron's algorithm: for each sample in
// turn, take it from the source whose achieved share lags its target weight the most
// (largest weight * n - taken), so every prefix of the blend is as close to the weights as
// whole samples allow. Each source is read in its own (already shuffled) order.
#pragma once

#include <memory>
#include <vector>

#include "data/sample_source.h"

namespace loom::data {

// dataset_index[i], dataset_sample_index[i] for i < size (Megatron's build_blending_indices).
void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index);

class BlendedDataset : public SampleSource {
 public:
  // weights are normalised; each source must hold at least the samples its weight asks for.
  BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> sources,
                 std::vector<double> weights, int64_t size);

  int64_t size() const override { return int64_t(dataset_index_.size()); }
  int seq_len() const override { return sources_[0]->seq_len(); }
  void fill_row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                std::vector<int32_t>& seg_lens) const override;
  int source_of(int64_t i) const { return dataset_index_[size_t(i)]; }
  const std::vector<double>& weights() const { return weights_; }

 private:
  std::vector<std::shared_ptr<const SampleSource>> sources_;
  std::vector<double> weights_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

}  // namespace loom::data
