// Causal flash attention on CUDA (FlashAttention-2 algorithm), fp32 in and out, fp32
// accumulation, GQA, packed sequences (cu_seqlens).
//
// Forward: a block owns `rows` query rows of one (sequence, query head); each row is owned by
// `group` threads that each hold DMAX / group of its dims (q, the output accumulator). Key and
// value tiles stream through shared memory; scores of a whole key tile are formed first, then
// the online softmax rescales the accumulator once per tile. Output and the log-sum-exp (for
// backward) are written once, at the end.
//
// Backward (deterministic, no atomics): delta = rowsum(dO * O); one kernel owns key rows and
// accumulates dK, dV over every query head of its GQA group and every query tile at or after
// the keys (queries and dO stream through shared memory); a second kernel owns query rows and
// accumulates dQ over the key tiles up to the diagonal (as the forward). P is recomputed from
// q, k and the saved log-sum-exp in both.
//
// Shapes and tile sizes: AttnCfg in launch.h. Work items (sequence, tile) come from
// plan_attention (longest work first).
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace loom::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Sum over the `G` consecutive lanes that own one row (G a power of two <= 32).
template <int G>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

template <int DMAX>
__global__ void __launch_bounds__(256) k_attn_fwd(AttnArgs a, float* out, float* lse) {
  using Cfg = AttnCfg<DMAX>;
  constexpr int G = Cfg::group, DPT = Cfg::dims_per_thread, BR = Cfg::rows, BC = Cfg::tile;
  __shared__ float Ks[BC][DMAX];
  __shared__ float Vs[BC][DMAX];
  const int seq = a.q_items[2 * blockIdx.x], qt = a.q_items[2 * blockIdx.x + 1];
  const int h = blockIdx.y, kvh = h / (a.Hq / a.Hkv);
  const int start = a.cu[seq], len = a.cu[seq + 1] - start;
  const int r = threadIdx.x / G, g = threadIdx.x % G;
  const int qi = qt * BR + r;
  const bool valid = qi < len;
  const float c = a.scale * kLog2e;  // scores in the exp2 domain

  float q[DPT], o[DPT];
  const float* qrow = a.q + int64_t{start + (valid ? qi : 0)} * a.ld + int64_t{h} * a.D;
#pragma unroll
  for (int i = 0; i < DPT; ++i) {
    const int d = g + G * i;
    q[i] = valid && d < a.D ? qrow[d] * c : 0.f;
    o[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int q_last = min(len, (qt + 1) * BR) - 1;
  const float* kb = a.k + int64_t{start} * a.ld + int64_t{kvh} * a.D;
  const float* vb = a.v + int64_t{start} * a.ld + int64_t{kvh} * a.D;
  for (int k0 = 0; k0 <= q_last; k0 += BC) {
    __syncthreads();  // the previous tile is no longer read
    for (int idx = threadIdx.x; idx < BC * DMAX; idx += blockDim.x) {
      const int j = idx / DMAX, d = idx % DMAX;
      const bool in = k0 + j < len && d < a.D;
      Ks[j][d] = in ? kb[int64_t{k0 + j} * a.ld + d] : 0.f;
      Vs[j][d] = in ? vb[int64_t{k0 + j} * a.ld + d] : 0.f;
    }
    __syncthreads();
    float s[BC];
    float mt = m;
#pragma unroll
    for (int j = 0; j < BC; ++j) {
      float p = 0.f;
#pragma unroll
      for (int i = 0; i < DPT; ++i) p += q[i] * Ks[j][g + G * i];
      p = group_sum<G>(p);
      s[j] = valid && k0 + j <= qi ? p : -INFINITY;
      mt = fmaxf(mt, s[j]);
    }
    if (mt != -INFINITY) {
      const float alpha = exp2f(m - mt);  // 0 on the first tile (m = -inf)
      l *= alpha;
#pragma unroll
      for (int i = 0; i < DPT; ++i) o[i] *= alpha;
#pragma unroll
      for (int j = 0; j < BC; ++j) {
        const float p = exp2f(s[j] - mt);
        l += p;
#pragma unroll
        for (int i = 0; i < DPT; ++i) o[i] += p * Vs[j][g + G * i];
      }
      m = mt;
    }
  }
  if (!valid) return;
  const int64_t row = start + qi;
  float* orow = out + row * a.Hq * a.D + int64_t{h} * a.D;
  const float inv = 1.f / l;
#pragma unroll
  for (int i = 0; i < DPT; ++i) {
    const int d = g + G * i;
    if (d < a.D) orow[d] = o[i] * inv;
  }
  if (g == 0) lse[row * a.Hq + h] = (m + log2f(l)) * kLn2;
}

// delta[row, h] = sum_d dO * O: one warp per (row, head).
__global__ void k_attn_delta(const float* out, const float* dout, float* delta, int row0, int row1,
                             int Hq, int D) {
  const int64_t w = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t{row1 - row0} * Hq;
  if (w >= n) return;
  const int64_t row = row0 + w / Hq;
  const int h = static_cast<int>(w % Hq);
  const float* o = out + row * Hq * D + int64_t{h} * D;
  const float* g = dout + row * Hq * D + int64_t{h} * D;
  float s = 0.f;
  for (int d = lane; d < D; d += 32) s += o[d] * g[d];
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);
  if (lane == 0) delta[row * Hq + h] = s;
}

template <int DMAX>
__global__ void __launch_bounds__(256)
    k_attn_dq(AttnArgs a, const float* dout, const float* lse, const float* delta, float* dq) {
  using Cfg = AttnCfg<DMAX>;
  constexpr int G = Cfg::group, DPT = Cfg::dims_per_thread, BR = Cfg::rows, BC = Cfg::tile;
  __shared__ float Ks[BC][DMAX];
  __shared__ float Vs[BC][DMAX];
  const int seq = a.q_items[2 * blockIdx.x], qt = a.q_items[2 * blockIdx.x + 1];
  const int h = blockIdx.y, kvh = h / (a.Hq / a.Hkv);
  const int start = a.cu[seq], len = a.cu[seq + 1] - start;
  const int r = threadIdx.x / G, g = threadIdx.x % G;
  const int qi = qt * BR + r;
  const bool valid = qi < len;
  const float c = a.scale * kLog2e;
  const int64_t row = start + (valid ? qi : 0);

  float q[DPT], go[DPT], acc[DPT];
  const float* qrow = a.q + row * a.ld + int64_t{h} * a.D;
  const float* grow = dout + row * a.Hq * a.D + int64_t{h} * a.D;
#pragma unroll
  for (int i = 0; i < DPT; ++i) {
    const int d = g + G * i;
    q[i] = valid && d < a.D ? qrow[d] * c : 0.f;
    go[i] = valid && d < a.D ? grow[d] : 0.f;
    acc[i] = 0.f;
  }
  const float lse2 = valid ? lse[row * a.Hq + h] * kLog2e : INFINITY;
  const float dl = valid ? delta[row * a.Hq + h] : 0.f;
  const int q_last = min(len, (qt + 1) * BR) - 1;
  const float* kb = a.k + int64_t{start} * a.ld + int64_t{kvh} * a.D;
  const float* vb = a.v + int64_t{start} * a.ld + int64_t{kvh} * a.D;
  for (int k0 = 0; k0 <= q_last; k0 += BC) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < BC * DMAX; idx += blockDim.x) {
      const int j = idx / DMAX, d = idx % DMAX;
      const bool in = k0 + j < len && d < a.D;
      Ks[j][d] = in ? kb[int64_t{k0 + j} * a.ld + d] : 0.f;
      Vs[j][d] = in ? vb[int64_t{k0 + j} * a.ld + d] : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int j = 0; j < BC; ++j) {
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int i = 0; i < DPT; ++i) {
        s += q[i] * Ks[j][g + G * i];
        dp += go[i] * Vs[j][g + G * i];
      }
      s = group_sum<G>(s);
      dp = group_sum<G>(dp);
      const float p = valid && k0 + j <= qi ? exp2f(s - lse2) : 0.f;
      const float ds = p * (dp - dl);
#pragma unroll
      for (int i = 0; i < DPT; ++i) acc[i] += ds * Ks[j][g + G * i];
    }
  }
  if (!valid) return;
  float* dqrow = dq + row * a.ld + int64_t{h} * a.D;
#pragma unroll
  for (int i = 0; i < DPT; ++i) {
    const int d = g + G * i;
    if (d < a.D) dqrow[d] = acc[i] * a.scale;
  }
}

template <int DMAX>
__global__ void __launch_bounds__(256) k_attn_dkdv(AttnArgs a, const float* dout, const float* lse,
                                                   const float* delta, float* dk, float* dv) {
  using Cfg = AttnCfg<DMAX>;
  constexpr int G = Cfg::group, DPT = Cfg::dims_per_thread, BK = Cfg::rows, BQ = Cfg::tile;
  __shared__ float Qs[BQ][DMAX];
  __shared__ float Gs[BQ][DMAX];  // dO
  __shared__ float L2[BQ], Dl[BQ];
  const int seq = a.k_items[2 * blockIdx.x], kt = a.k_items[2 * blockIdx.x + 1];
  const int kvh = blockIdx.y, group = a.Hq / a.Hkv;
  const int start = a.cu[seq], len = a.cu[seq + 1] - start;
  const int r = threadIdx.x / G, g = threadIdx.x % G;
  const int kj = kt * BK + r;
  const bool valid = kj < len;
  const float c = a.scale * kLog2e;
  const int64_t krow = start + (valid ? kj : 0);

  float k[DPT], v[DPT], ak[DPT], av[DPT];
  const float* kr = a.k + krow * a.ld + int64_t{kvh} * a.D;
  const float* vr = a.v + krow * a.ld + int64_t{kvh} * a.D;
#pragma unroll
  for (int i = 0; i < DPT; ++i) {
    const int d = g + G * i;
    k[i] = valid && d < a.D ? kr[d] * c : 0.f;
    v[i] = valid && d < a.D ? vr[d] : 0.f;
    ak[i] = 0.f;
    av[i] = 0.f;
  }
  const int q_first = kt * BK;  // causal: no query before the block's first key sees it
  const int64_t ldo = int64_t{a.Hq} * a.D;
  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    for (int q0 = q_first; q0 < len; q0 += BQ) {
      __syncthreads();
      for (int idx = threadIdx.x; idx < BQ * DMAX; idx += blockDim.x) {
        const int i = idx / DMAX, d = idx % DMAX;
        const bool in = q0 + i < len && d < a.D;
        const int64_t row = start + q0 + i;
        Qs[i][d] = in ? a.q[row * a.ld + int64_t{h} * a.D + d] : 0.f;
        Gs[i][d] = in ? dout[row * ldo + int64_t{h} * a.D + d] : 0.f;
      }
      for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
        const bool in = q0 + i < len;
        const int64_t row = start + q0 + i;
        L2[i] = in ? lse[row * a.Hq + h] * kLog2e : INFINITY;
        Dl[i] = in ? delta[row * a.Hq + h] : 0.f;
      }
      __syncthreads();
#pragma unroll 4
      for (int i = 0; i < BQ; ++i) {
        float s = 0.f, dp = 0.f;
#pragma unroll
        for (int t = 0; t < DPT; ++t) {
          s += k[t] * Qs[i][g + G * t];
          dp += v[t] * Gs[i][g + G * t];
        }
        s = group_sum<G>(s);
        dp = group_sum<G>(dp);
        const int qi = q0 + i;
        const float p = valid && qi < len && qi >= kj ? exp2f(s - L2[i]) : 0.f;
        const float ds = p * (dp - Dl[i]);
#pragma unroll
        for (int t = 0; t < DPT; ++t) {
          av[t] += p * Gs[i][g + G * t];
          ak[t] += ds * Qs[i][g + G * t];
        }
      }
    }
  }
  if (!valid) return;
  float* dkr = dk + krow * a.ld + int64_t{kvh} * a.D;
  float* dvr = dv + krow * a.ld + int64_t{kvh} * a.D;
#pragma unroll
  for (int i = 0; i < DPT; ++i) {
    const int d = g + G * i;
    if (d < a.D) {
      dkr[d] = ak[i] * a.scale;
      dvr[d] = av[i];
    }
  }
}

template <int DMAX>
void launch_fwd(cudaStream_t st, const AttnArgs& a, float* out, float* lse) {
  k_attn_fwd<DMAX><<<dim3(a.n_q_items, a.Hq), AttnCfg<DMAX>::threads, 0, st>>>(a, out, lse);
  LOOM_CUDA_LAUNCHED("attention_forward");
}

template <int DMAX>
void launch_bwd(cudaStream_t st, const AttnArgs& a, const float* lse, const float* dout, float* dq,
                float* dk, float* dv, const float* delta) {
  if (a.n_k_items > 0) {
    k_attn_dkdv<DMAX>
        <<<dim3(a.n_k_items, a.Hkv), AttnCfg<DMAX>::threads, 0, st>>>(a, dout, lse, delta, dk, dv);
    LOOM_CUDA_LAUNCHED("attention_backward (dk, dv)");
  }
  k_attn_dq<DMAX>
      <<<dim3(a.n_q_items, a.Hq), AttnCfg<DMAX>::threads, 0, st>>>(a, dout, lse, delta, dq);
  LOOM_CUDA_LAUNCHED("attention_backward (dq)");
}

}  // namespace

void attention_forward(cudaStream_t st, const AttnArgs& a, float* out, float* lse) {
  if (a.n_q_items == 0) return;
  switch (attn_tile_config(a.D).dmax) {
    case 32:
      return launch_fwd<32>(st, a, out, lse);
    case 64:
      return launch_fwd<64>(st, a, out, lse);
    case 128:
      return launch_fwd<128>(st, a, out, lse);
    default:
      return launch_fwd<256>(st, a, out, lse);
  }
}

void attention_delta(cudaStream_t st, const AttnArgs& a, const float* out, const float* dout,
                     float* delta) {
  const int64_t warps = int64_t{a.row1 - a.row0} * a.Hq;
  k_attn_delta<<<grid_1d(warps * 32, kThreads, 1, 1 << 30), kThreads, 0, st>>>(
      out, dout, delta, a.row0, a.row1, a.Hq, a.D);
  LOOM_CUDA_LAUNCHED("attention_backward (delta)");
}

void attention_backward(cudaStream_t st, const AttnArgs& a, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, float* delta) {
  if (a.n_q_items == 0) return;
  attention_delta(st, a, out, dout, delta);
  switch (attn_tile_config(a.D).dmax) {
    case 32:
      return launch_bwd<32>(st, a, lse, dout, dq, dk, dv, delta);
    case 64:
      return launch_bwd<64>(st, a, lse, dout, dq, dk, dv, delta);
    case 128:
      return launch_bwd<128>(st, a, lse, dout, dq, dk, dv, delta);
    default:
      return launch_bwd<256>(st, a, lse, dout, dq, dk, dv, delta);
  }
}

}  // namespace loom::cuda
