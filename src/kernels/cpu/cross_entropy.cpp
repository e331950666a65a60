// Fused softmax + cross-entropy over the vocabulary, with its gradient.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/simd_math.h"

namespace loom::cpu {

namespace {

// One row of cross_entropy (below): its loss, and its gradient into dx when dx is not null.
inline void cross_entropy_row(float* loss, float* dx, const float* x, int t, int V, float g) {
  if (t < 0) {  // ignored row (padding, masked prompt)
    if (loss != nullptr) *loss = 0.0f;
    if (dx != nullptr) {
#pragma omp simd
      for (int j = 0; j < V; ++j) dx[j] = 0.0f;
    }
    return;
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
    const float scale = static_cast<float>(g / sum);
#pragma omp simd
    for (int j = 0; j < V; ++j) dx[j] *= scale;
    dx[t] -= g;
  }
  if (loss != nullptr) *loss = static_cast<float>(std::log(sum) + m - xt);
}

void check_targets(const int32_t* targets, int N, int V) {
  LOOM_CHECK(V > 0, "cross_entropy: vocabulary size V=", V, " must be positive");
  for (int i = 0; i < N; ++i)
    LOOM_CHECK(targets[i] < V, "cross_entropy: target ", targets[i], " at row ", i,
               " is outside the vocabulary [0, ", V, ")");
}

}  // namespace

// Per row: m = max(x); S = sum exp(x - m) (float exps, double sum); loss = log S + m - x[t];
// dlogits = (exp(x - m) / S - onehot(t)) * g with g = dloss * weights[i] (weights nullable).
// dlogits may be logits itself: the
// row max and target logit are read before the row is overwritten, and each element is read
// before it is written at the same index.
void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                   int N, int V, float dloss, const float* weights) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (worth_parallel(N, V))
  for (int i = 0; i < N; ++i) {
    float* dx = dlogits != nullptr ? dlogits + static_cast<int64_t>(i) * V : nullptr;
    cross_entropy_row(losses != nullptr ? losses + i : nullptr, dx,
                      logits + static_cast<int64_t>(i) * V, targets[i], V,
                      weights != nullptr ? dloss * weights[i] : dloss);
  }
}

// The bf16 policy's head: each row rounded to bf16 in place, its loss and gradient as
// cross_entropy's, the gradient rounded to bf16 in place (its bits also in dlogit_bits): the
// roundings the Decoder did in two separate passes over the whole [N, V] logits, done here on
// the row while it is in cache. Row by row, so the same bits.
void cross_entropy_bf16(float* losses, float* logits, uint16_t* dlogit_bits, const int32_t* targets,
                        int N, int V, float dloss, const float* weights, bool grads) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (worth_parallel(N, V))
  for (int i = 0; i < N; ++i) {
    float* x = logits + static_cast<int64_t>(i) * V;
    round_bf16_array(x, nullptr, size_t(V));  // one thread's row: no nested team
    cross_entropy_row(losses != nullptr ? losses + i : nullptr, grads ? x : nullptr, x, targets[i],
                      V, weights != nullptr ? dloss * weights[i] : dloss);
    if (grads)
      round_bf16_array(x, dlogit_bits ? dlogit_bits + static_cast<int64_t>(i) * V : nullptr,
                       size_t(V));
  }
}

// The bf16 head whose GEMM wrote the logits as bf16 (2 bytes: a 256-row chunk of GPT-2's
// vocabulary fits the L3 where its fp32 form did not): each row widened into a per-thread fp32
// row in cache, cross_entropy_row on it, and the gradient's bf16 bits written over the row's
// logits. The same values as cross_entropy_bf16 on the widened logits (rounding a bf16 value
// is exact), so the same bits.
void cross_entropy_from_bf16(float* losses, uint16_t* logits, const int32_t* targets, int N, int V,
                             float dloss, const float* weights, bool grads) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (worth_parallel(N, V))
  for (int i = 0; i < N; ++i) {
    thread_local std::vector<float> row;
    row.resize(size_t(V));
    uint16_t* bits = logits + static_cast<int64_t>(i) * V;
    bf16_to_f32_array(bits, row.data(), size_t(V));  // one thread's row: no nested team
    cross_entropy_row(losses != nullptr ? losses + i : nullptr, grads ? row.data() : nullptr,
                      row.data(), targets[i], V, weights != nullptr ? dloss * weights[i] : dloss);
    if (grads) f32_to_bf16_array(row.data(), bits, size_t(V));
  }
}

}  // namespace loom::cpu
