// Ops over one tensor-parallel rank's slice [v0, v0 + V) of the vocabulary: the embedding
// lookup and its backward, and the three steps of the vocabulary-parallel cross-entropy
// (parallel/vocab_parallel.h runs the collectives between them).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace loom::cpu {

void embedding_forward_slice(float* out, const int32_t* ids, const float* table, int N, int C,
                             int v0, int V) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, C))
  for (int i = 0; i < N; ++i) {
    float* o = out + static_cast<int64_t>(i) * C;
    const int64_t id = int64_t(ids[i]) - v0;
    if (id < 0 || id >= V) {
      std::memset(o, 0, size_t(C) * sizeof(float));
      continue;
    }
    // 0 + x, as a lookup added into zeroed rows: -0 becomes +0, the same bits as before.
    const float* row = table + id * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = 0.f + row[c];
  }
}

// Threads split the channels (cache-line multiples) and walk all rows in order: every
// element of dtable sees the same sequence of additions whatever the thread count.
void embedding_backward_slice(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                              int v0, int V) {
  constexpr int kAlign = 16;
#pragma omp parallel if (worth_parallel(N, C))
  {
    const int nt = omp_get_num_threads();
    const int t = omp_get_thread_num();
    const int units = (C + kAlign - 1) / kAlign;
    const int c0 = std::min(C, units * t / nt * kAlign);
    const int c1 = std::min(C, units * (t + 1) / nt * kAlign);
    for (int i = 0; i < N && c0 < c1; ++i) {
      const int64_t id = int64_t(ids[i]) - v0;
      if (id < 0 || id >= V) continue;
      float* drow = dtable + id * C;
      const float* d = dout + static_cast<int64_t>(i) * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) drow[c] += d[c];
    }
  }
}

void cross_entropy_slice_max(float* mx, const float* logits, int N, int V) {
  LOOM_CHECK(V > 0, "cross_entropy_slice_max: slice width V=", V, " must be positive");
#pragma omp parallel for schedule(static) if (worth_parallel(N, V))
  for (int i = 0; i < N; ++i) {
    const float* row = logits + int64_t(i) * V;
    mx[i] = *std::max_element(row, row + V);
  }
}

// Exponentials and their sum in double: the sum over slices then matches one process's.
void cross_entropy_slice_sums(float* se, float* tl, const float* logits, const float* mx,
                              const int32_t* targets, int N, int V, int v0) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, V))
  for (int i = 0; i < N; ++i) {
    const float* row = logits + int64_t(i) * V;
    double s = 0;
    for (int j = 0; j < V; ++j) s += std::exp(double(row[j]) - mx[i]);
    se[i] = static_cast<float>(s);
    const int t = targets[i] - v0;
    tl[i] = targets[i] >= 0 && t >= 0 && t < V ? row[t] : 0.f;
  }
}

void cross_entropy_slice_finish(float* losses, float* dlogits, const float* logits, const float* mx,
                                const float* se, const float* tl, const int32_t* targets, int N,
                                int V, int v0, float dloss, const float* weights) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, V))
  for (int i = 0; i < N; ++i) {
    const float* row = logits + int64_t(i) * V;
    float* d = dlogits ? dlogits + int64_t(i) * V : nullptr;
    if (targets[i] < 0) {
      losses[i] = 0;
      if (d) std::fill(d, d + V, 0.f);
      continue;
    }
    losses[i] = static_cast<float>(std::log(double(se[i])) + mx[i] - tl[i]);
    if (!d) continue;
    const int t = targets[i] - v0;
    const double inv = 1.0 / se[i];
    const double g = weights ? double(dloss) * weights[i] : dloss;
    // Each element is read before it is written at the same index (d may alias logits).
    for (int j = 0; j < V; ++j) {
      double p = std::exp(double(row[j]) - mx[i]) * inv;
      d[j] = static_cast<float>((p - (j == t ? 1.0 : 0.0)) * g);
    }
  }
}

}  // namespace loom::cpu
