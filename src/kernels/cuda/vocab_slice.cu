// The Backend's vocabulary-slice ops on the GPU (semantics: kernels/backend.h): the
// vocabulary-parallel embedding and the three steps of the vocabulary-parallel cross-entropy.
// One block per row for the row reductions; the embedding's backward walks the rows in order
// per column, so every table element sees one fixed order of additions (deterministic, like
// the CPU's; a sort-based version as embedding_backward's would be faster on many tokens).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/vocab_slice.h"

namespace loom::cuda {
namespace {

constexpr int kRowThreads = 256;

#define LOOM_VOCAB_LAUNCHED(name) LOOM_CUDA_CHECK(cudaGetLastError())

__global__ void k_embed_fwd_slice(float* out, const int32_t* ids, const float* table, int N, int C,
                                  int v0, int V) {
  const int64_t n = int64_t(N) * C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / C, c = e % C;
    const int64_t id = int64_t(ids[i]) - v0;
    out[e] = id >= 0 && id < V ? 0.f + table[id * C + c] : 0.f;
  }
}

__global__ void k_embed_bwd_slice(float* dtable, const float* dout, const int32_t* ids, int N,
                                  int C, int v0, int V) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int i = 0; i < N; ++i) {
    const int64_t id = int64_t(ids[i]) - v0;
    if (id >= 0 && id < V) dtable[id * C + c] += dout[int64_t(i) * C + c];
  }
}

// Tree reductions over one block (blockDim.x == kRowThreads).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T sh[kRowThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] = op(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  T r = sh[0];
  __syncthreads();
  return r;
}

__global__ void k_ce_max(float* mx, const float* logits, int V) {
  const float* row = logits + int64_t(blockIdx.x) * V;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_reduce(m, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void k_ce_sums(float* se, float* tl, const float* logits, const float* mx,
                          const int32_t* targets, int V, int v0) {
  const int i = blockIdx.x;
  const float* row = logits + int64_t(i) * V;
  double s = 0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += exp(double(row[j]) - mx[i]);
  s = block_reduce(s, [](double a, double b) { return a + b; });
  if (threadIdx.x == 0) {
    se[i] = static_cast<float>(s);
    const int t = targets[i] - v0;
    tl[i] = targets[i] >= 0 && t >= 0 && t < V ? row[t] : 0.f;
  }
}

__global__ void k_ce_finish(float* losses, float* dlogits, const float* logits, const float* mx,
                            const float* se, const float* tl, const int32_t* targets, int V, int v0,
                            float dloss, const float* weights) {
  const int i = blockIdx.x;
  const float* row = logits + int64_t(i) * V;
  float* d = dlogits ? dlogits + int64_t(i) * V : nullptr;
  if (targets[i] < 0) {
    if (threadIdx.x == 0) losses[i] = 0;
    if (d)
      for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = 0.f;
    return;
  }
  if (threadIdx.x == 0) losses[i] = static_cast<float>(log(double(se[i])) + mx[i] - tl[i]);
  if (!d) return;
  const int t = targets[i] - v0;
  const double inv = 1.0 / se[i];
  const double g = weights ? double(dloss) * weights[i] : dloss;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const double p = exp(double(row[j]) - mx[i]) * inv;
    d[j] = static_cast<float>((p - (j == t ? 1.0 : 0.0)) * g);
  }
}

int grid_for(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535));
}

}  // namespace

void embedding_forward_slice(cudaStream_t st, float* out, const int32_t* ids, const float* table,
                             int N, int C, int v0, int V) {
  if (int64_t(N) * C <= 0) return;
  k_embed_fwd_slice<<<grid_for(int64_t(N) * C), 256, 0, st>>>(out, ids, table, N, C, v0, V);
  LOOM_VOCAB_LAUNCHED("embedding_forward_slice");
}

void embedding_backward_slice(cudaStream_t st, float* dtable, const float* dout, const int32_t* ids,
                              int N, int C, int v0, int V) {
  if (N <= 0 || C <= 0) return;
  k_embed_bwd_slice<<<(C + 127) / 128, 128, 0, st>>>(dtable, dout, ids, N, C, v0, V);
  LOOM_VOCAB_LAUNCHED("embedding_backward_slice");
}

void cross_entropy_slice_max(cudaStream_t st, float* mx, const float* logits, int N, int V) {
  if (N <= 0) return;
  k_ce_max<<<N, kRowThreads, 0, st>>>(mx, logits, V);
  LOOM_VOCAB_LAUNCHED("cross_entropy_slice_max");
}

void cross_entropy_slice_sums(cudaStream_t st, float* se, float* tl, const float* logits,
                              const float* mx, const int32_t* targets, int N, int V, int v0) {
  if (N <= 0) return;
  k_ce_sums<<<N, kRowThreads, 0, st>>>(se, tl, logits, mx, targets, V, v0);
  LOOM_VOCAB_LAUNCHED("cross_entropy_slice_sums");
}

void cross_entropy_slice_finish(cudaStream_t st, float* losses, float* dlogits, const float* logits,
                                const float* mx, const float* se, const float* tl,
                                const int32_t* targets, int N, int V, int v0, float dloss,
                                const float* weights) {
  if (N <= 0) return;
  k_ce_finish<<<N, kRowThreads, 0, st>>>(losses, dlogits, logits, mx, se, tl, targets, V, v0, dloss,
                                         weights);
  LOOM_VOCAB_LAUNCHED("cross_entropy_slice_finish");
}

}  // namespace loom::cuda
