// LayerNorm and RMSNorm over the last dimension.
//
// Backward passes reduce the parameter gradients over rows without atomics and without
// depending on the thread count: rows are cut into a number of blocks that depends only on N,
// each block sums its rows in order into its own slice of scratch memory, and the slices are
// then added in block order. One pass over dout and inp, bit-identical run to run.
// dinp may alias dout (in-place backward).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/scratch.h"

namespace loom::cpu {
namespace {

constexpr int kMaxRowBlocks = 64;

int row_blocks(int N) {
  return std::min(N, kMaxRowBlocks);
}
int block_begin(int blk, int nblocks, int N) {
  return static_cast<int>(static_cast<int64_t>(N) * blk / nblocks);
}

// dst[c] += sum over blocks b (in order) of partial[b * stride + c].
void add_block_partials(float* dst, const float* partial, int nblocks, int64_t stride, int C) {
  if (dst == nullptr) return;
  constexpr int kCols = 256;
  const int ncol_blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (worth_parallel(nblocks, C))
  for (int cb = 0; cb < ncol_blocks; ++cb) {
    const int c0 = cb * kCols;
    const int w = std::min(kCols, C - c0);
    float acc[kCols] = {};
    for (int b = 0; b < nblocks; ++b) {
      const float* p = partial + b * stride + c0;
#pragma omp simd
      for (int c = 0; c < w; ++c) acc[c] += p[c];
    }
#pragma omp simd
    for (int c = 0; c < w; ++c) dst[c0 + c] += acc[c];
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, C))
  for (int i = 0; i < N; ++i) {
    const float* x = inp + static_cast<int64_t>(i) * C;
    float* y = out + static_cast<int64_t>(i) * C;
    // Two passes (mean, then centred squares): no cancellation when |mean| >> std.
    const float m = ordered_sum<float>(C, [x](int64_t c) { return x[c]; }) / C;
    const float var =
        ordered_sum<float>(C, [x, m](int64_t c) { return (x[c] - m) * (x[c] - m); }) / C;
    const float s = 1.0f / std::sqrt(var + eps);
    if (bias != nullptr) {
#pragma omp simd
      for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    } else {
#pragma omp simd
      for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c];
    }
    if (mean != nullptr) mean[i] = m;
    if (rstd != nullptr) rstd[i] = s;
  }
}

// With n = (x - mean) rstd and g = dout * weight:
//   dinp = rstd * (g - mean(g) - n * mean(g n)),  dweight += sum_rows dout n,  dbias += sum dout.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  if (N <= 0 || C <= 0) return;
  const int nblocks = row_blocks(N);
  const int64_t stride = 2 * static_cast<int64_t>(C);  // per block: [dweight | dbias] partials
  float* partial = thread_scratch(nblocks * stride);
#pragma omp parallel for schedule(static) if (worth_parallel(N, C))
  for (int b = 0; b < nblocks; ++b) {
    float* pw = partial + b * stride;
    float* pb = pw + C;
    std::fill(pw, pw + stride, 0.0f);
    for (int i = block_begin(b, nblocks, N); i < block_begin(b + 1, nblocks, N); ++i) {
      const float* x = inp + static_cast<int64_t>(i) * C;
      const float* dy = dout + static_cast<int64_t>(i) * C;
      float* dx = dinp + static_cast<int64_t>(i) * C;
      const float m = mean[i], s = rstd[i];
      const float g_mean =
          ordered_sum<float>(C, [dy, weight](int64_t c) { return dy[c] * weight[c]; }) / C;
      const float gn_mean =
          ordered_sum<float>(C, [=](int64_t c) { return dy[c] * weight[c] * ((x[c] - m) * s); }) /
          C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float d = dy[c];  // read before dx[c] is written: dinp may alias dout
        const float n = (x[c] - m) * s;
        dx[c] = s * (d * weight[c] - g_mean - n * gn_mean);
        pw[c] += d * n;
        pb[c] += d;
      }
    }
  }
  add_block_partials(dweight, partial, nblocks, stride, C);
  add_block_partials(dbias, partial + C, nblocks, stride, C);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, C))
  for (int i = 0; i < N; ++i) {
    const float* x = inp + static_cast<int64_t>(i) * C;
    float* y = out + static_cast<int64_t>(i) * C;
    const float ms = ordered_sum<float>(C, [x](int64_t c) { return x[c] * x[c]; }) / C;
    const float s = 1.0f / std::sqrt(ms + eps);
#pragma omp simd
    for (int c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
    if (rstd != nullptr) rstd[i] = s;
  }
}

// With r = rstd and g = dout * weight: d r / d x_c = -r^3 x_c / C, so
//   dinp = r * (g - x * r^2 * mean(g x)),  dweight += sum_rows dout * x * r.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const int nblocks = row_blocks(N);
  const int64_t stride = C;
  float* partial = thread_scratch(nblocks * stride);
#pragma omp parallel for schedule(static) if (worth_parallel(N, C))
  for (int b = 0; b < nblocks; ++b) {
    float* pw = partial + b * stride;
    std::fill(pw, pw + stride, 0.0f);
    for (int i = block_begin(b, nblocks, N); i < block_begin(b + 1, nblocks, N); ++i) {
      const float* x = inp + static_cast<int64_t>(i) * C;
      const float* dy = dout + static_cast<int64_t>(i) * C;
      float* dx = dinp + static_cast<int64_t>(i) * C;
      const float r = rstd[i];
      const float gx_mean =
          ordered_sum<float>(C, [=](int64_t c) { return dy[c] * weight[c] * x[c]; }) / C;
      const float k = r * r * gx_mean;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float d = dy[c];  // read before dx[c] is written: dinp may alias dout
        dx[c] = r * (d * weight[c] - x[c] * k);
        pw[c] += d * x[c] * r;
      }
    }
  }
  add_block_partials(dweight, partial, nblocks, stride, C);
}

}  // namespace loom::cpu
