// AdamW optimizer step and the reductions used for clipping and overflow checks.
#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reduce.h"

namespace loom::cpu {

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p) with mhat = m / (1 - b1^t), vhat = v / (1 - b2^t).
void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float grad_scale, int64_t step) {
  LOOM_CHECK(step >= 1, "adamw: step=", step, " must be >= 1 (bias correction is 1-based)");
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), step)));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), step)));
  const float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;
#pragma omp parallel for simd schedule(static) if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + one_minus_b1 * g;
    const float vi = beta2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = param[i];
    param[i] = p - lr * ((mi * c1) / (std::sqrt(vi * c2) + eps) + weight_decay * p);
  }
}

// Fixed chunks (their number depends only on n) summed in double, then the chunk sums added
// in chunk order: the same bits for any thread count.
double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  constexpr int64_t kMaxChunks = 256;
  constexpr int64_t kMinChunk = 8192;
  const int64_t nchunks = std::min(kMaxChunks, (n + kMinChunk - 1) / kMinChunk);
  double partial[kMaxChunks];
#pragma omp parallel for schedule(static) if (nchunks > 1 && worth_parallel(n))
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = n * c / nchunks, e = n * (c + 1) / nchunks;
    const float* xc = x + b;
    partial[c] = ordered_sum<double>(e - b, [xc](int64_t i) {
      const double d = xc[i];
      return d * d;  // exact: a float's square fits in a double
    });
  }
  double total = 0.0;
  for (int64_t c = 0; c < nchunks; ++c) total += partial[c];
  return total;
}

bool all_finite(const float* x, int64_t n) {
  uint32_t bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i)
    bad |= (std::bit_cast<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u;
  return bad == 0;
}

}  // namespace loom::cpu
