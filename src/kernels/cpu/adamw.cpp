// AdamW optimizer step and the reductions used for clipping and overflow checks. The combined
// `parallel for simd` loops name their `if` clause's construct (`if (parallel : ...)`): a bare
// `if` also applies to the simd part, and GCC then ran every parameter below the parallel
// threshold (norms, biases) as a scalar loop (elementwise.cpp had the same bug).
#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reduce.h"

namespace loom::cpu {

namespace {

// The bias corrections of a 1-based step: 1 / (1 - beta^t), in double, then fp32.
struct AdamwFactors {
  float c1, c2, one_minus_b1, one_minus_b2;
};
AdamwFactors adamw_factors(float beta1, float beta2, int64_t step) {
  LOOM_CHECK(step >= 1, "adamw: step=", step, " must be >= 1 (bias correction is 1-based)");
  return {static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), step))),
          static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), step))),
          1.0f - beta1, 1.0f - beta2};
}

// One element's update; m and v are updated in place, the new weight is returned. Both kernels
// below inline this one expression, so the fused kernel's master weights are the plain
// kernel's bit for bit (the test compares them).
inline float adamw_element(float p, float grad, float& m, float& v, float lr, float beta1,
                           float beta2, float eps, float weight_decay, float grad_scale,
                           const AdamwFactors& f) {
  const float g = grad * grad_scale;
  const float mi = beta1 * m + f.one_minus_b1 * g;
  const float vi = beta2 * v + f.one_minus_b2 * g * g;
  m = mi;
  v = vi;
  return p - lr * ((mi * f.c1) / (std::sqrt(vi * f.c2) + eps) + weight_decay * p);
}

// core/dtype.h's f32_to_bf16 without a branch (so the loop vectorises): the bf16 value's fp32
// bit pattern (low half zero). NaN keeps its payload's top bits and gets the quiet bit.
inline uint32_t round_bits_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t r =
      (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) : u + 0x7fffu + ((u >> 16) & 1u);
  return r & 0xffff0000u;
}

template <bool kStoreF32, bool kStoreBf16>
void adamw_to_bf16_loop(float* master, const float* grad, float* m, float* v, int64_t n, float lr,
                        float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                        const AdamwFactors& f, float* model, uint16_t* model_bf16) {
#pragma omp parallel for simd schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float p = adamw_element(master[i], grad[i], m[i], v[i], lr, beta1, beta2, eps,
                                  weight_decay, grad_scale, f);
    master[i] = p;
    const uint32_t r = round_bits_bf16(p);
    if constexpr (kStoreF32) model[i] = std::bit_cast<float>(r);
    if constexpr (kStoreBf16) model_bf16[i] = static_cast<uint16_t>(r >> 16);
  }
}

}  // namespace

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p) with mhat = m / (1 - b1^t), vhat = v / (1 - b2^t).
void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float grad_scale, int64_t step) {
  const AdamwFactors f = adamw_factors(beta1, beta2, step);
#pragma omp parallel for simd schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i)
    param[i] = adamw_element(param[i], grad[i], m[i], v[i], lr, beta1, beta2, eps, weight_decay,
                             grad_scale, f);
}

// adamw on the master, and in the same pass (one read of the master) the model's weights
// derived from it: model[i] = round_bf16(master[i]) and model_bf16[i] its bits. Replaces
// adamw + copy + round + convert (four passes over the weights) under the bf16 policy. model
// null (the 2-byte weights, ParamSet::drop_fp32: no fp32 model values kept): the bf16 bits
// alone, 4 bytes per element less written.
void adamw_to_bf16(float* master, const float* grad, float* m, float* v, int64_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                   int64_t step, float* model, uint16_t* model_bf16) {
  const AdamwFactors f = adamw_factors(beta1, beta2, step);
  LOOM_CHECK(model || model_bf16, "adamw_to_bf16: neither fp32 nor bf16 model weights to write");
  if (model && model_bf16)
    adamw_to_bf16_loop<true, true>(master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                   grad_scale, f, model, model_bf16);
  else if (model)
    adamw_to_bf16_loop<true, false>(master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                    grad_scale, f, model, nullptr);
  else
    adamw_to_bf16_loop<false, true>(master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                    grad_scale, f, nullptr, model_bf16);
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
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i)
    bad |= (std::bit_cast<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u;
  return bad == 0;
}

}  // namespace loom::cpu
