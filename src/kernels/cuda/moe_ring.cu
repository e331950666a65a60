// Mixture-of-experts and ring-attention ops on the GPU (semantics: kernels/backend.h; the CPU
// versions in kernels/cpu/moe.cpp, attention_block.cpp, attention_merge.cpp). Written simply
// first: one thread per token (router), per expert (statistics, routing plan) or per output
// row (block attention), each walking its loop in the CPU's order, so the results match the
// CPU's up to the rounding of exp and of reassociated dot products, and are deterministic.
// Speed (tiled block attention, a parallel routing scan) comes later.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_ring.h"

namespace loom::cuda {
namespace {

constexpr int kMoeThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kMoeThreads - 1) / kMoeThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

#define MOE_GRID_STRIDE(i, n)                                               \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__device__ void moe_record_error(DeviceError* e, int code, int op, int row, int value) {
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->op = op;
    e->row = row;
    e->value = value;
  }
}

// ---- router

__global__ void k_router_fwd(float* scores, int32_t* topk_idx, float* topk_w, const float* logits,
                             int N, int E, int k, bool sigmoid, bool renormalize) {
  MOE_GRID_STRIDE(t, N) {
    const float* l = logits + t * E;
    float* s = scores + t * E;
    if (!sigmoid) {
      float m = l[0];
      for (int e = 1; e < E; ++e) m = fmaxf(m, l[e]);
      double sum = 0.0;
      for (int e = 0; e < E; ++e) {
        s[e] = expf(l[e] - m);
        sum += s[e];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int e = 0; e < E; ++e) s[e] *= inv;
    } else {
      for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + expf(-l[e]));
    }
    // Slot j takes the best expert strictly after slot j-1's in (score desc, index asc).
    int32_t* idx = topk_idx + t * k;
    float* w = topk_w + t * k;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (j > 0) {
          const int prev = idx[j - 1];
          const bool after = s[e] < s[prev] || (s[e] == s[prev] && e > prev);
          if (!after) continue;
        }
        if (best < 0 || s[e] > s[best]) best = e;
      }
      idx[j] = best;
      w[j] = best >= 0 ? s[best] : 0.0f;
      if (best < 0) break;  // NaN scores: the routing plan names the token
    }
    if (renormalize) {
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += w[j];
      const float inv = sum > 0.0 ? static_cast<float>(1.0 / sum) : 0.0f;
      for (int j = 0; j < k; ++j) w[j] *= inv;
    }
  }
}

__global__ void k_router_bwd(float* dlogits, const float* dtopk_w, const float* dscores,
                             const float* scores, const int32_t* topk_idx, int N, int E, int k,
                             bool sigmoid, bool renormalize) {
  MOE_GRID_STRIDE(t, N) {
    const float* s = scores + t * E;
    const int32_t* idx = topk_idx + t * k;
    const float* dw = dtopk_w + t * k;
    float* ds = dlogits + t * E;
    for (int e = 0; e < E; ++e) ds[e] = dscores ? dscores[t * E + e] : 0.0f;
    if (renormalize) {
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += s[idx[j]];
      double dot = 0.0;
      for (int j = 0; j < k; ++j) dot += static_cast<double>(dw[j]) * (s[idx[j]] / sum);
      for (int j = 0; j < k; ++j) ds[idx[j]] += static_cast<float>((dw[j] - dot) / sum);
    } else {
      for (int j = 0; j < k; ++j) ds[idx[j]] += dw[j];
    }
    if (!sigmoid) {
      double dot = 0.0;
      for (int e = 0; e < E; ++e) dot += static_cast<double>(s[e]) * ds[e];
      for (int e = 0; e < E; ++e) ds[e] = s[e] * (ds[e] - static_cast<float>(dot));
    } else {
      for (int e = 0; e < E; ++e) ds[e] = ds[e] * s[e] * (1.0f - s[e]);
    }
  }
}

// ---- load-balancing statistics: one thread per expert, tokens in order (the CPU's order).

__global__ void k_check_experts(const int32_t* topk_idx, int64_t pairs, int E, int k,
                                DeviceError* err) {
  MOE_GRID_STRIDE(i, pairs) {
    const int32_t e = topk_idx[i];
    if (e < 0 || e >= E) moe_record_error(err, kErrExpertRange, kOpMoe, int(i / k), e);
  }
}

// assigned[e] (double) and the score sum of expert e (double, token order).
__global__ void k_expert_sums(double* assigned, double* score_sum, const float* scores,
                              const int32_t* topk_idx, int N, int E, int k) {
  MOE_GRID_STRIDE(e, E) {
    int64_t n = 0;
    for (int64_t i = 0; i < int64_t(N) * k; ++i) n += topk_idx[i] == e;
    double s = 0.0;
    for (int64_t t = 0; t < N; ++t) s += scores[t * E + e];
    assigned[e] = double(n);
    score_sum[e] = s;
  }
}

// One thread: the loss and the per-expert gradient row (cpu::moe_aux_loss's arithmetic).
__global__ void k_aux_finish(double* loss, float* grad, const double* assigned,
                             const double* score_sum, int N, int E, int k, float coeff,
                             float dloss) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double l = 0.0;
  for (int e = 0; e < E; ++e) {
    const double f = assigned[e] / (static_cast<double>(N) * k);
    const double mean = score_sum[e] / N;
    l += f * mean;
    grad[e] = static_cast<float>(static_cast<double>(dloss) * coeff * E * f / N);
  }
  *loss = static_cast<double>(coeff) * E * l;
}

__global__ void k_stats_finish(float* stats, const double* assigned, const double* score_sum, int N,
                               int E) {
  MOE_GRID_STRIDE(e, E) {
    stats[e] = static_cast<float>(assigned[e]);
    stats[E + e] = static_cast<float>(score_sum[e]);
    if (e == 0) stats[2 * E] = static_cast<float>(N);
  }
}

__global__ void k_add_row(float* x, const float* row, int N, int C) {
  MOE_GRID_STRIDE(i, int64_t(N) * C) {
    x[i] += row[i % C];
  }
}

// ---- routing plan: one block; experts over its threads, each scanning the pairs in order.
__global__ void k_plan(int32_t* plan, const int32_t* topk_idx, int N, int E, int k, int capacity) {
  const int64_t pairs = int64_t(N) * k;
  int32_t* assigned = plan;
  int32_t* counts = plan + E;
  int32_t* offsets = counts + E;
  int32_t* row_of = offsets + E + 1;
  int32_t* token_of = row_of + pairs;
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    row_of[i] = -1;
    token_of[i] = 0;
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t n = 0;
    for (int64_t i = 0; i < pairs; ++i) n += topk_idx[i] == e;
    assigned[e] = n;
    counts[e] = capacity < 0 ? n : min(n, capacity);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t pos = 0;
    for (int64_t i = 0; i < pairs; ++i) {
      if (topk_idx[i] != e) continue;
      if (pos < counts[e]) {
        const int32_t row = offsets[e] + pos;
        row_of[i] = row;
        token_of[row] = static_cast<int32_t>(i / k);
      }
      ++pos;
    }
  }
}

// ---- permutations

__global__ void k_permute(float* out, const float* x, const int32_t* token_of, int rows, int C) {
  MOE_GRID_STRIDE(i, int64_t(rows) * C) {
    const int64_t r = i / C, c = i % C;
    out[i] = x[int64_t(token_of[r]) * C + c];
  }
}

__global__ void k_permute_bwd(float* dx, const float* dout, const int32_t* row_of, int N, int k,
                              int C) {
  MOE_GRID_STRIDE(i, int64_t(N) * C) {
    const int64_t t = i / C, c = i % C;
    float d = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t row = row_of[t * k + j];
      if (row >= 0) d += dout[int64_t(row) * C + c];
    }
    dx[i] = d;
  }
}

__global__ void k_unpermute(float* y, const float* expert_out, const float* topk_w,
                            const int32_t* row_of, int N, int k, int C) {
  MOE_GRID_STRIDE(i, int64_t(N) * C) {
    const int64_t t = i / C, c = i % C;
    float o = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t row = row_of[t * k + j];
      if (row >= 0) o += topk_w[t * k + j] * expert_out[int64_t(row) * C + c];
    }
    y[i] = o;
  }
}

// One thread per (token, slot): its row of dexpert_out and the dot product in the CPU's order.
__global__ void k_unpermute_bwd(float* dexpert_out, float* dtopk_w, const float* dy,
                                const float* expert_out, const float* topk_w, const int32_t* row_of,
                                int N, int k, int C) {
  MOE_GRID_STRIDE(p, int64_t(N) * k) {
    const int64_t t = p / k;
    const int32_t row = row_of[p];
    if (row < 0) {
      dtopk_w[p] = 0.0f;
      continue;
    }
    const float w = topk_w[p];
    const float* g = dy + t * C;
    const float* src = expert_out + int64_t(row) * C;
    float* d = dexpert_out + int64_t(row) * C;
    double dot = 0.0;
    for (int c = 0; c < C; ++c) {
      d[c] = w * g[c];
      dot += static_cast<double>(g[c]) * src[c];
    }
    dtopk_w[p] = static_cast<float>(dot);
  }
}

// ---- block attention: one thread per (query row, head), an online softmax over the keys.

__device__ float dotd(const float* a, const float* b, int D) {
  float s = 0.f;
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

__global__ void k_block_fwd(float* out, float* lse, const float* q, int ldq, const float* k,
                            const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                            float scale) {
  const int group = Hq / Hkv;
  MOE_GRID_STRIDE(it, int64_t(nq) * Hq) {
    const int64_t i = it / Hq;
    const int h = int(it % Hq), hk = h / group;
    const float* qi = q + i * ldq + int64_t(h) * D;
    float o[kMaxBlockHeadDim];
    for (int d = 0; d < D; ++d) o[d] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int j = 0; j < nk; ++j) {
      const float s = scale * dotd(qi, k + int64_t(j) * ldk + int64_t(hk) * D, D);
      if (s > m) {
        const float alpha = expf(m - s);  // 0 for the first key (m = -inf)
        l *= alpha;
        for (int d = 0; d < D; ++d) o[d] *= alpha;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
      const float* vj = v + int64_t(j) * ldk + int64_t(hk) * D;
      for (int d = 0; d < D; ++d) o[d] += p * vj[d];
    }
    float* dst = out + it * D;
    const float inv = l > 0 ? 1.f / l : 0.f;
    for (int d = 0; d < D; ++d) dst[d] = o[d] * inv;
    lse[it] = l > 0 ? m + logf(l) : -INFINITY;
  }
}

// P and dS of (query row i, head h) against key j, from the final lse.
__device__ void block_p_ds(float* p, float* ds, const float* q, int ldq, const float* k,
                           const float* v, int ldk, const float* dout, const float* out,
                           const float* lse, int64_t i, int h, int64_t j, int Hq, int hk, int D,
                           float scale) {
  const int64_t row = i * Hq + h;
  const float L = lse[row];
  const float* g = dout + row * D;
  const float delta = dotd(g, out + row * D, D);
  const float s = scale * dotd(q + i * ldq + int64_t(h) * D, k + j * ldk + int64_t(hk) * D, D);
  *p = L == -INFINITY ? 0.f : expf(s - L);
  *ds = *p * (dotd(g, v + j * ldk + int64_t(hk) * D, D) - delta);
}

__global__ void k_block_bwd_dq(float* dq, const float* dout, const float* out, const float* lse,
                               const float* q, int ldq, const float* k, const float* v, int ldk,
                               int nq, int nk, int Hq, int Hkv, int D, float scale) {
  const int group = Hq / Hkv;
  MOE_GRID_STRIDE(it, int64_t(nq) * Hq) {
    const int64_t i = it / Hq;
    const int h = int(it % Hq), hk = h / group;
    float* dqi = dq + i * ldq + int64_t(h) * D;
    for (int64_t j = 0; j < nk; ++j) {
      float p, ds;
      block_p_ds(&p, &ds, q, ldq, k, v, ldk, dout, out, lse, i, h, j, Hq, hk, D, scale);
      const float* kj = k + j * ldk + int64_t(hk) * D;
      for (int d = 0; d < D; ++d) dqi[d] += scale * ds * kj[d];
    }
  }
}

// One thread per (key row, kv head): every query row of the group's heads, heads then rows.
__global__ void k_block_bwd_dkv(float* dk, float* dv, const float* dout, const float* out,
                                const float* lse, const float* q, int ldq, const float* k,
                                const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                                float scale) {
  const int group = Hq / Hkv;
  MOE_GRID_STRIDE(it, int64_t(nk) * Hkv) {
    const int64_t j = it / Hkv;
    const int hk = int(it % Hkv);
    float* dkj = dk + j * ldk + int64_t(hk) * D;
    float* dvj = dv + j * ldk + int64_t(hk) * D;
    for (int h = hk * group; h < (hk + 1) * group; ++h)
      for (int64_t i = 0; i < nq; ++i) {
        float p, ds;
        block_p_ds(&p, &ds, q, ldq, k, v, ldk, dout, out, lse, i, h, j, Hq, hk, D, scale);
        const float* g = dout + (i * Hq + h) * D;
        const float* qi = q + i * ldq + int64_t(h) * D;
        for (int d = 0; d < D; ++d) {
          dvj[d] += p * g[d];
          dkj[d] += scale * ds * qi[d];
        }
      }
  }
}

__global__ void k_merge(float* out, float* lse, const float* out_a, const float* lse_a,
                        const float* out_b, const float* lse_b, int64_t rows, int D) {
  MOE_GRID_STRIDE(i, rows) {
    const float la = lse_a[i], lb = lse_b[i];
    float wa = 0.f, wb = 0.f, l = -INFINITY;
    if (!(la == -INFINITY && lb == -INFINITY)) {
      const float m = fmaxf(la, lb);
      const double ea = exp(static_cast<double>(la) - m);
      const double eb = exp(static_cast<double>(lb) - m);
      const double sum = ea + eb;
      wa = static_cast<float>(ea / sum);
      wb = static_cast<float>(eb / sum);
      l = static_cast<float>(m + log(sum));
    }
    const float* a = out_a + i * D;
    const float* b = out_b + i * D;
    float* o = out + i * D;
    for (int d = 0; d < D; ++d) o[d] = wa * a[d] + wb * b[d];
    lse[i] = l;
  }
}

__global__ void k_add_2d(float* dst, int ldd, const float* src, int lds, int rows, int cols) {
  MOE_GRID_STRIDE(i, int64_t(rows) * cols) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ldd + c] += src[r * lds + c];
  }
}

}  // namespace

#define MOE_LAUNCHED(name) LOOM_CUDA_LAUNCHED(name)

void moe_router_forward(cudaStream_t st, float* scores, int32_t* topk_idx, float* topk_w,
                        const float* logits, int N, int E, int k, bool sigmoid, bool renormalize) {
  LOOM_CHECK(E >= 1 && k >= 1 && k <= E, "MoE router needs 1 <= k <= E (k=", k, ", E=", E, ")");
  if (N == 0) return;
  k_router_fwd<<<blocks_for(N), kMoeThreads, 0, st>>>(scores, topk_idx, topk_w, logits, N, E, k,
                                                      sigmoid, renormalize);
  MOE_LAUNCHED("moe_router_forward");
}

void moe_router_backward(cudaStream_t st, float* dlogits, const float* dtopk_w,
                         const float* dscores, const float* scores, const int32_t* topk_idx, int N,
                         int E, int k, bool sigmoid, bool renormalize) {
  if (N == 0) return;
  k_router_bwd<<<blocks_for(N), kMoeThreads, 0, st>>>(dlogits, dtopk_w, dscores, scores, topk_idx,
                                                      N, E, k, sigmoid, renormalize);
  MOE_LAUNCHED("moe_router_backward");
}

void moe_aux_loss(cudaStream_t st, double* loss, float* dscores, const float* scores,
                  const int32_t* topk_idx, int N, int E, int k, float coeff, float dloss,
                  double* scratch, DeviceError* err) {
  if (N == 0) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(double), st));
    return;
  }
  k_check_experts<<<blocks_for(int64_t(N) * k), kMoeThreads, 0, st>>>(topk_idx, int64_t(N) * k, E,
                                                                      k, err);
  MOE_LAUNCHED("moe_aux_loss (check)");
  double* assigned = scratch;
  double* score_sum = scratch + E;
  float* grad = reinterpret_cast<float*>(scratch + 2 * E);  // E floats in E doubles' room
  k_expert_sums<<<blocks_for(E), kMoeThreads, 0, st>>>(assigned, score_sum, scores, topk_idx, N, E,
                                                       k);
  MOE_LAUNCHED("moe_aux_loss (sums)");
  k_aux_finish<<<1, 1, 0, st>>>(loss, grad, assigned, score_sum, N, E, k, coeff, dloss);
  MOE_LAUNCHED("moe_aux_loss (finish)");
  if (dscores) add_row_broadcast(st, dscores, grad, N, E);
}

void moe_expert_stats(cudaStream_t st, float* stats, const float* scores, const int32_t* topk_idx,
                      int N, int E, int k, double* scratch, DeviceError* err) {
  if (N > 0) {
    k_check_experts<<<blocks_for(int64_t(N) * k), kMoeThreads, 0, st>>>(topk_idx, int64_t(N) * k, E,
                                                                        k, err);
    MOE_LAUNCHED("moe_expert_stats (check)");
  }
  k_expert_sums<<<blocks_for(E), kMoeThreads, 0, st>>>(scratch, scratch + E, scores, topk_idx, N, E,
                                                       k);
  MOE_LAUNCHED("moe_expert_stats (sums)");
  k_stats_finish<<<blocks_for(E), kMoeThreads, 0, st>>>(stats, scratch, scratch + E, N, E);
  MOE_LAUNCHED("moe_expert_stats (finish)");
}

void add_row_broadcast(cudaStream_t st, float* x, const float* row, int N, int C) {
  if (int64_t(N) * C == 0) return;
  k_add_row<<<blocks_for(int64_t(N) * C), kMoeThreads, 0, st>>>(x, row, N, C);
  MOE_LAUNCHED("add_row_broadcast");
}

void moe_plan_routing(cudaStream_t st, int32_t* plan, const int32_t* topk_idx, int N, int E, int k,
                      int capacity, DeviceError* err) {
  if (N > 0) {
    k_check_experts<<<blocks_for(int64_t(N) * k), kMoeThreads, 0, st>>>(topk_idx, int64_t(N) * k, E,
                                                                        k, err);
    MOE_LAUNCHED("moe_plan_routing (check)");
  }
  k_plan<<<1, 1024, 0, st>>>(plan, topk_idx, N, E, k, capacity);
  MOE_LAUNCHED("moe_plan_routing");
}

void moe_permute(cudaStream_t st, float* out, const float* x, const int32_t* token_of, int rows,
                 int C) {
  if (int64_t(rows) * C == 0) return;
  k_permute<<<blocks_for(int64_t(rows) * C), kMoeThreads, 0, st>>>(out, x, token_of, rows, C);
  MOE_LAUNCHED("moe_permute");
}

void moe_permute_backward(cudaStream_t st, float* dx, const float* dout, const int32_t* row_of,
                          int N, int k, int C) {
  if (int64_t(N) * C == 0) return;
  k_permute_bwd<<<blocks_for(int64_t(N) * C), kMoeThreads, 0, st>>>(dx, dout, row_of, N, k, C);
  MOE_LAUNCHED("moe_permute_backward");
}

void moe_unpermute(cudaStream_t st, float* y, const float* expert_out, const float* topk_w,
                   const int32_t* row_of, int N, int k, int C) {
  if (int64_t(N) * C == 0) return;
  k_unpermute<<<blocks_for(int64_t(N) * C), kMoeThreads, 0, st>>>(y, expert_out, topk_w, row_of, N,
                                                                  k, C);
  MOE_LAUNCHED("moe_unpermute");
}

void moe_unpermute_backward(cudaStream_t st, float* dexpert_out, float* dtopk_w, const float* dy,
                            const float* expert_out, const float* topk_w, const int32_t* row_of,
                            int N, int k, int C) {
  if (int64_t(N) * k == 0) return;
  k_unpermute_bwd<<<blocks_for(int64_t(N) * k), kMoeThreads, 0, st>>>(
      dexpert_out, dtopk_w, dy, expert_out, topk_w, row_of, N, k, C);
  MOE_LAUNCHED("moe_unpermute_backward");
}

static void check_block(int ldq, int ldk, int nq, int nk, int Hq, int Hkv, int D, float scale,
                        const char* op) {
  LOOM_CHECK(Hq > 0 && Hkv > 0 && D > 0 && Hq % Hkv == 0, op, ": bad head counts/dim Hq=", Hq,
             " Hkv=", Hkv, " D=", D);
  LOOM_CHECK(D <= kMaxBlockHeadDim, op, " (cuda): head dim ", D, " above ", kMaxBlockHeadDim);
  LOOM_CHECK(nq >= 0 && nk >= 0, op, ": negative row counts nq=", nq, " nk=", nk);
  LOOM_CHECK(ldq >= Hq * D && ldk >= Hkv * D, op, ": row strides ldq=", ldq, " ldk=", ldk,
             " smaller than the heads");
  LOOM_CHECK(scale > 0 && std::isfinite(scale), op, ": scale=", scale, " must be positive");
}

void attention_block_forward(cudaStream_t st, float* out, float* lse, const float* q, int ldq,
                             const float* k, const float* v, int ldk, int nq, int nk, int Hq,
                             int Hkv, int D, float scale) {
  check_block(ldq, ldk, nq, nk, Hq, Hkv, D, scale, "attention_block_forward");
  if (nq == 0) return;
  // 64 threads a block: each keeps a row of up to kMaxBlockHeadDim floats in local memory.
  const int64_t n = int64_t(nq) * Hq;
  k_block_fwd<<<int((n + 63) / 64), 64, 0, st>>>(out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D,
                                                 scale);
  MOE_LAUNCHED("attention_block_forward");
}

void attention_block_backward(cudaStream_t st, float* dq, float* dk, float* dv, const float* dout,
                              const float* out, const float* lse, const float* q, int ldq,
                              const float* k, const float* v, int ldk, int nq, int nk, int Hq,
                              int Hkv, int D, float scale) {
  check_block(ldq, ldk, nq, nk, Hq, Hkv, D, scale, "attention_block_backward");
  if (nq == 0 || nk == 0) return;
  k_block_bwd_dq<<<blocks_for(int64_t(nq) * Hq), kMoeThreads, 0, st>>>(
      dq, dout, out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D, scale);
  MOE_LAUNCHED("attention_block_backward (dq)");
  k_block_bwd_dkv<<<blocks_for(int64_t(nk) * Hkv), kMoeThreads, 0, st>>>(
      dk, dv, dout, out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D, scale);
  MOE_LAUNCHED("attention_block_backward (dk, dv)");
}

void attention_merge(cudaStream_t st, float* out, float* lse, const float* out_a,
                     const float* lse_a, const float* out_b, const float* lse_b, int N, int H,
                     int D) {
  const int64_t rows = int64_t(N) * H;
  if (rows == 0) return;
  k_merge<<<blocks_for(rows), kMoeThreads, 0, st>>>(out, lse, out_a, lse_a, out_b, lse_b, rows, D);
  MOE_LAUNCHED("attention_merge");
}

void add_2d(cudaStream_t st, float* dst, int ldd, const float* src, int lds, int rows, int cols) {
  if (int64_t(rows) * cols == 0) return;
  k_add_2d<<<blocks_for(int64_t(rows) * cols), kMoeThreads, 0, st>>>(dst, ldd, src, lds, rows,
                                                                     cols);
  MOE_LAUNCHED("add_2d");
}

}  // namespace loom::cuda
