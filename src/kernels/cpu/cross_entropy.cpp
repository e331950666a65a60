// Fused softmax + cross-entropy over the vocabulary, with its gradient.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/simd_math.h"

namespace loom::cpu {

// Per row: m = max(x); S = sum exp(x - m) (float exps, double sum); loss = log S + m - x[t];
// dlogits = (exp(x - m) / S - onehot(t)) * g with g = dloss * weights[i] (weights nullable).
// dlogits may be logits itself: the
// row max and target logit are read before the row is overwritten, and each element is read
// before it is written at the same index.
void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                   int N, int V, float dloss, const float* weights) {
  LOOM_CHECK(V > 0, "cross_entropy: vocabulary size V=", V, " must be positive");
  for (int i = 0; i < N; ++i)
    LOOM_CHECK(targets[i] < V, "cross_entropy: target ", targets[i], " at row ", i,
               " is outside the vocabulary [0, ", V, ")");
#pragma omp parallel for schedule(static) if (worth_parallel(N, V))
  for (int i = 0; i < N; ++i) {
    const float* x = logits + static_cast<int64_t>(i) * V;
    float* dx = dlogits != nullptr ? dlogits + static_cast<int64_t>(i) * V : nullptr;
    const int t = targets[i];
    if (t < 0) {  // ignored row (padding, masked prompt)
      if (losses != nullptr) losses[i] = 0.0f;
      if (dx != nullptr) {
#pragma omp simd
        for (int j = 0; j < V; ++j) dx[j] = 0.0f;
      }
      continue;
    }
    const float m = row_max(x, V);
    const float xt = x[t];  // before dx (possibly x itself) is overwritten
    double sum;
    if (dx == nullptr) {
      sum = ordered_sum<double>(V, [x, m](int64_t j) { return fast_exp(x[j] - m); });
    } else {
      // Keep the exponentials in dx: one exp per logit, the row stays in cache for the scaling.
#pragma omp simd
      for (int j = 0; j < V; ++j) dx[j] = fast_exp(x[j] - m);
      sum = ordered_sum<double>(V, [dx](int64_t j) { return dx[j]; });
      const float g = weights != nullptr ? dloss * weights[i] : dloss;
      const float scale = static_cast<float>(g / sum);
#pragma omp simd
      for (int j = 0; j < V; ++j) dx[j] *= scale;
      dx[t] -= g;
    }
    if (losses != nullptr) losses[i] = static_cast<float>(std::log(sum) + m - xt);
  }
}

}  // namespace loom::cpu
