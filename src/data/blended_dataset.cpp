#include "data/blended_dataset.h"

#include <algorithm>

#include "core/error.h"

namespace loom::data {

void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index) {
  const size_t n = weights.size();
  std::vector<int64_t> taken(n, 0);
  dataset_index->resize(size_t(size));
  dataset_sample_index->resize(size_t(size));
  for (int64_t s = 0; s < size; ++s) {
    double denom = std::max(double(s), 1.0);
    size_t best = 0;
    double best_err = weights[0] * denom - double(taken[0]);
    for (size_t k = 1; k < n; ++k) {
      double err = weights[k] * denom - double(taken[k]);
      if (err > best_err) {
        best_err = err;
        best = k;
      }
    }
    (*dataset_index)[size_t(s)] = int16_t(best);
    (*dataset_sample_index)[size_t(s)] = taken[best]++;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> sources,
                               std::vector<double> weights, int64_t size)
    : sources_(std::move(sources)), weights_(std::move(weights)) {
  LOOM_CHECK(!sources_.empty() && sources_.size() == weights_.size() && sources_.size() < 32768,
             "blend: need one weight per dataset (", sources_.size(), " datasets, ",
             weights_.size(), " weights)");
  double sum = 0;
  for (double w : weights_) {
    LOOM_CHECK(w >= 0, "blend: weights must be non-negative");
    sum += w;
  }
  LOOM_CHECK(sum > 0, "blend: weights sum to zero");
  for (double& w : weights_) w /= sum;
  for (auto& s : sources_)
    LOOM_CHECK(s->seq_len() == sources_[0]->seq_len(), "blend: datasets differ in seq_len");
  build_blending_indices(weights_, size, &dataset_index_, &dataset_sample_index_);
  std::vector<int64_t> need(sources_.size(), 0);
  for (int64_t s = 0; s < size; ++s)
    need[size_t(dataset_index_[size_t(s)])] = dataset_sample_index_[size_t(s)] + 1;
  for (size_t k = 0; k < sources_.size(); ++k)
    LOOM_CHECK(need[k] <= sources_[k]->size(), "blend: dataset ", k, " has ", sources_[k]->size(),
               " samples but its weight needs ", need[k]);
}

void BlendedDataset::fill_row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                              std::vector<int32_t>& seg_lens) const {
  LOOM_CHECK(i >= 0 && i < size(), "blended sample ", i, " out of range (", size(), ")");
  sources_[size_t(dataset_index_[size_t(i)])]->fill_row(dataset_sample_index_[size_t(i)], tokens,
                                                        targets, positions, seg_lens);
}

}  // namespace loom::data
