#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace loom {

void validate(const SamplingOptions& o) {
  LOOM_CHECK(o.temperature >= 0, "temperature must be >= 0, got ", o.temperature);
  LOOM_CHECK(o.top_k >= 0, "top-k must be >= 0, got ", o.top_k);
  LOOM_CHECK(o.top_p > 0 && o.top_p <= 1, "top-p must lie in (0, 1], got ", o.top_p);
}

int sample_token(const float* logits, int V, const SamplingOptions& o, uint64_t draw) {
  if (o.temperature == 0) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  // Candidates sorted by logit, descending (ties by id, for determinism).
  std::vector<int> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  auto cmp = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
  idx.resize(k);
  std::vector<double> p(k);
  double mx = logits[idx[0]], sum = 0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / o.temperature);
  // Nucleus: the smallest prefix whose probability reaches top_p.
  int keep = k;
  if (o.top_p < 1) {
    double acc = 0;
    for (int i = 0; i < k; ++i) {
      acc += p[i] / sum;
      if (acc >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  double u = uniform_at(o.seed, name_key("sample"), draw) * total;
  for (int i = 0; i < keep; ++i) {
    u -= p[i];
    if (u < 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace loom
