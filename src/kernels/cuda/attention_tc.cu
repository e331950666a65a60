// Causal flash attention on the tensor cores: the FlashAttention-2 algorithm of attention.cu,
// with the four products per tile (S = Q K^T, O += P V; in backward dP = dO V^T, dV += P^T dO,
// dK += dS^T Q, dQ += dS K) as bf16 x bf16 -> fp32 WMMA 16x16x16 fragments. Inputs and outputs
// stay fp32 in global memory; tiles are rounded to bf16 (nearest even) when they are staged in
// shared memory, and so are P and dS before the products that read them. Softmax statistics,
// the running output and every accumulation are fp32. Same results layout as attention.cu
// (out, lse, dq/dk/dv), same work items (planned with kRows rows), no atomics.
//
// A block is 4 warps and owns 64 rows (query rows in forward and dQ, key rows in dK/dV); each
// warp owns 16 of them and streams 64-row tiles of the other side through shared memory. Head
// dims up to DMAX (64 or 128) with D % 16 == 0; the columns past D are zero in the tiles.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace loom::cuda {
namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kRows = 64;  // rows a block owns (= AttnTcRows)
constexpr int kTile = 64;  // rows of the streamed side per tile
constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kRows == kWarps * 16, "a warp owns 16 rows");
static_assert(kRows == attn_tc_rows, "work items are planned with attn_tc_rows rows");

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Leading dimensions (elements) of the shared-memory tiles: multiples of 16 bytes as WMMA
// requires, padded so consecutive rows start in different banks.
template <int DMAX>
struct Ld {
  static constexpr int h = DMAX + 8;   // bf16 tile rows [64][DMAX]
  static constexpr int s = kTile + 4;  // fp32 per-warp scores [16][64]
  static constexpr int p = kTile + 8;  // bf16 per-warp probabilities [16][64]
  static constexpr int o = DMAX + 4;   // fp32 per-warp output accumulator [16][DMAX]
};

// Rows [r0, r0 + 64) of one head of a row-major fp32 matrix (row stride ld, the head's first
// column at base) into a bf16 tile; rows at or past len and columns at or past D are zero.
// vec4: base and ld allow 16-byte loads (checked on the host), four columns at a time.
template <int DMAX>
__device__ void load_tile(bf16* dst, const float* base, int64_t ld, int r0, int len, int D,
                          bool vec4) {
  if (vec4) {
    constexpr int C4 = DMAX / 4;
    for (int idx = threadIdx.x; idx < kTile * C4; idx += kBlockThreads) {
      const int i = idx / C4, d = (idx % C4) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r0 + i < len && d < D)
        v = *reinterpret_cast<const float4*>(base + int64_t{r0 + i} * ld + d);
      auto* p = reinterpret_cast<__nv_bfloat162*>(dst + i * Ld<DMAX>::h + d);
      p[0] = __floats2bfloat162_rn(v.x, v.y);
      p[1] = __floats2bfloat162_rn(v.z, v.w);
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kTile * DMAX; idx += kBlockThreads) {
    const int i = idx / DMAX, d = idx % DMAX;
    const bool in = r0 + i < len && d < D;
    dst[i * Ld<DMAX>::h + d] = __float2bfloat16_rn(in ? base[int64_t{r0 + i} * ld + d] : 0.f);
  }
}

// C[16][64] = A[16][DMAX] B[64][DMAX]^T for one warp (A: 16 rows of a tile, B: a whole tile),
// stored row-major into fp32 shared memory.
template <int DMAX>
__device__ void warp_abt(float* C, const bf16* A, const bf16* B) {
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < DMAX / 16; ++kk) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, A + kk * 16, Ld<DMAX>::h);
      wmma::load_matrix_sync(fb, B + (j * 16) * Ld<DMAX>::h + kk * 16, Ld<DMAX>::h);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(C + j * 16, acc, Ld<DMAX>::s, wmma::mem_row_major);
  }
}

// acc[jd] += P[16][64] T[64][DMAX] (P bf16 per warp, T a bf16 tile), column block jd of 16.
template <int DMAX>
__device__ void warp_pt(FragC& acc, const bf16* P, const bf16* T, int jd) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    FragA fa;
    FragBRow fb;
    wmma::load_matrix_sync(fa, P + kk * 16, Ld<DMAX>::p);
    wmma::load_matrix_sync(fb, T + (kk * 16) * Ld<DMAX>::h + jd * 16, Ld<DMAX>::h);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// Writes a warp's accumulators (16 rows x DMAX) times `mul` to global rows first_row + r
// (r < nvalid), row stride ld, columns < D, staging each 16x16 block through `stage`.
template <int DMAX>
__device__ void warp_store(float* dst, int64_t ld, int nvalid, int D, const FragC* acc, float mul,
                           float* stage) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int jd = 0; jd < DMAX / 16; ++jd) {
    wmma::store_matrix_sync(stage, acc[jd], Ld<DMAX>::s, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, c = jd * 16 + e % 16;
      if (r < nvalid && c < D) dst[int64_t{r} * ld + c] = stage[r * Ld<DMAX>::s + e % 16] * mul;
    }
    __syncwarp();
  }
}

template <int DMAX>
constexpr size_t fwd_smem() {
  return size_t{3} * kTile * Ld<DMAX>::h * sizeof(bf16) +
         size_t{kWarps} * 16 * (Ld<DMAX>::s + Ld<DMAX>::o) * sizeof(float) +
         size_t{kWarps} * 16 * Ld<DMAX>::p * sizeof(bf16);
}

template <int DMAX>
__global__ void __launch_bounds__(kBlockThreads) k_attn_fwd_tc(AttnArgs a, float* out, float* lse) {
  using L = Ld<DMAX>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kTile * L::h;
  bf16* Vs = Ks + kTile * L::h;
  float* Sw = reinterpret_cast<float*>(Vs + kTile * L::h);
  float* Ow = Sw + kWarps * 16 * L::s;
  bf16* Pw = reinterpret_cast<bf16*>(Ow + kWarps * 16 * L::o);

  const int seq = a.q_items[2 * blockIdx.x], qt = a.q_items[2 * blockIdx.x + 1];
  const int h = blockIdx.y, kvh = h / (a.Hq / a.Hkv);
  const int start = a.cu[seq], len = a.cu[seq + 1] - start;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kRows, wq0 = q0 + warp * 16;
  float* S = Sw + warp * 16 * L::s;
  float* O = Ow + warp * 16 * L::o;
  bf16* P = Pw + warp * 16 * L::p;
  // Row r of the warp's 16 is shared by lanes 2r and 2r+1, each holding half of its columns.
  const int r = lane / 2, half = lane % 2;
  const int qi = wq0 + r;
  const bool valid = qi < len;
  const float c = a.scale * kLog2e;  // scores in the exp2 domain

  load_tile<DMAX>(Qs, a.q + int64_t{start} * a.ld + int64_t{h} * a.D, a.ld, q0, len, a.D, a.vec4);
  for (int i = lane; i < 16 * L::o; i += 32) O[i] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int q_last = min(len, q0 + kRows) - 1;
  const int warp_last = min(q_last, wq0 + 15);
  const float* kb = a.k + int64_t{start} * a.ld + int64_t{kvh} * a.D;
  const float* vb = a.v + int64_t{start} * a.ld + int64_t{kvh} * a.D;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<DMAX>(Ks, kb, a.ld, k0, len, a.D, a.vec4);
    load_tile<DMAX>(Vs, vb, a.ld, k0, len, a.D, a.vec4);
    __syncthreads();
    if (k0 > warp_last) continue;  // causal: none of these keys is visible to this warp's rows
    warp_abt<DMAX>(S, Qs + (warp * 16) * L::h, Ks);
    __syncwarp();
    float* srow = S + r * L::s + half * 32;
    float mt = -INFINITY;
#pragma unroll 8
    for (int j = 0; j < 32; ++j) {
      const int kj = k0 + half * 32 + j;
      const float s = valid && kj <= qi ? srow[j] * c : -INFINITY;
      srow[j] = s;
      mt = fmaxf(mt, s);
    }
    mt = fmaxf(mt, __shfl_xor_sync(kFull, mt, 1));
    const float mn = fmaxf(m, mt);
    float alpha = 1.f, sum = 0.f;
    bf16* prow = P + r * L::p + half * 32;
    if (mn == -INFINITY) {  // a row past the sequence: nothing visible yet
#pragma unroll 8
      for (int j = 0; j < 32; ++j) prow[j] = __float2bfloat16_rn(0.f);
    } else {
      alpha = exp2f(m - mn);  // 0 on the row's first visible tile (m = -inf)
#pragma unroll 8
      for (int j = 0; j < 32; ++j) {
        const float p = exp2f(srow[j] - mn);
        sum += p;
        prow[j] = __float2bfloat16_rn(p);
      }
      m = mn;
    }
    sum += __shfl_xor_sync(kFull, sum, 1);
    l = l * alpha + sum;
    float* orow = O + r * L::o + half * (DMAX / 2);
#pragma unroll 8
    for (int d = 0; d < DMAX / 2; ++d) orow[d] *= alpha;
    __syncwarp();
#pragma unroll
    for (int jd = 0; jd < DMAX / 16; ++jd) {
      FragC acc;
      wmma::load_matrix_sync(acc, O + jd * 16, L::o, wmma::mem_row_major);
      warp_pt<DMAX>(acc, P, Vs, jd);
      wmma::store_matrix_sync(O + jd * 16, acc, L::o, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (!valid) return;
  const int64_t row = start + qi;
  float* orow = out + row * a.Hq * a.D + int64_t{h} * a.D;
  const float inv = 1.f / l;
  for (int d = half; d < a.D; d += 2) orow[d] = O[r * L::o + d] * inv;
  if (half == 0) lse[row * a.Hq + h] = (m + log2f(l)) * kLn2;
}

template <int DMAX>
constexpr size_t bwd_smem() {
  return size_t{4} * kTile * Ld<DMAX>::h * sizeof(bf16) +
         size_t{kWarps} * 16 * 2 * Ld<DMAX>::s * sizeof(float) +
         size_t{kWarps} * 16 * 2 * Ld<DMAX>::p * sizeof(bf16) + size_t{2} * kTile * sizeof(float);
}

// dQ for 64 query rows of one (sequence, query head): dS = P o (dP - delta), dQ = scale dS K.
template <int DMAX>
__global__ void __launch_bounds__(kBlockThreads)
    k_attn_dq_tc(AttnArgs a, const float* dout, const float* lse, const float* delta, float* dq) {
  using L = Ld<DMAX>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Gs = Qs + kTile * L::h;  // dO
  bf16* Ks = Gs + kTile * L::h;
  bf16* Vs = Ks + kTile * L::h;
  float* Sw = reinterpret_cast<float*>(Vs + kTile * L::h);
  float* Dw = Sw + kWarps * 16 * L::s;
  bf16* Pw = reinterpret_cast<bf16*>(Dw + kWarps * 16 * L::s);

  const int seq = a.q_items[2 * blockIdx.x], qt = a.q_items[2 * blockIdx.x + 1];
  const int h = blockIdx.y, kvh = h / (a.Hq / a.Hkv);
  const int start = a.cu[seq], len = a.cu[seq + 1] - start;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kRows, wq0 = q0 + warp * 16;
  float* S = Sw + warp * 16 * L::s;
  float* Dp = Dw + warp * 16 * L::s;
  bf16* P = Pw + warp * 16 * L::p;
  const int r = lane / 2, half = lane % 2;
  const int qi = wq0 + r;
  const bool valid = qi < len;
  const float c = a.scale * kLog2e;
  const int64_t ldo = int64_t{a.Hq} * a.D;

  load_tile<DMAX>(Qs, a.q + int64_t{start} * a.ld + int64_t{h} * a.D, a.ld, q0, len, a.D, a.vec4);
  load_tile<DMAX>(Gs, dout + int64_t{start} * ldo + int64_t{h} * a.D, ldo, q0, len, a.D, a.vec4);
  const int64_t row = start + (valid ? qi : 0);
  const float lse2 = valid ? lse[row * a.Hq + h] * kLog2e : INFINITY;
  const float dl = valid ? delta[row * a.Hq + h] : 0.f;
  FragC acc[DMAX / 16];
#pragma unroll
  for (int jd = 0; jd < DMAX / 16; ++jd) wmma::fill_fragment(acc[jd], 0.f);
  const int q_last = min(len, q0 + kRows) - 1;
  const int warp_last = min(q_last, wq0 + 15);
  const float* kb = a.k + int64_t{start} * a.ld + int64_t{kvh} * a.D;
  const float* vb = a.v + int64_t{start} * a.ld + int64_t{kvh} * a.D;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {
    __syncthreads();
    load_tile<DMAX>(Ks, kb, a.ld, k0, len, a.D, a.vec4);
    load_tile<DMAX>(Vs, vb, a.ld, k0, len, a.D, a.vec4);
    __syncthreads();
    if (k0 > warp_last) continue;
    warp_abt<DMAX>(S, Qs + (warp * 16) * L::h, Ks);
    warp_abt<DMAX>(Dp, Gs + (warp * 16) * L::h, Vs);
    __syncwarp();
    const float* srow = S + r * L::s + half * 32;
    const float* drow = Dp + r * L::s + half * 32;
    bf16* prow = P + r * L::p + half * 32;
#pragma unroll 8
    for (int j = 0; j < 32; ++j) {
      const int kj = k0 + half * 32 + j;
      const float p = valid && kj <= qi ? exp2f(srow[j] * c - lse2) : 0.f;
      prow[j] = __float2bfloat16_rn(p * (drow[j] - dl));
    }
    __syncwarp();
#pragma unroll
    for (int jd = 0; jd < DMAX / 16; ++jd) warp_pt<DMAX>(acc[jd], P, Ks, jd);
  }
  if (wq0 >= len) return;
  warp_store<DMAX>(dq + int64_t{start + wq0} * a.ld + int64_t{h} * a.D, a.ld, len - wq0, a.D, acc,
                   a.scale, S);
}

// dK, dV for 64 key rows of one (sequence, kv head), over every query head of its GQA group and
// every query tile at or after the keys: dV += P^T dO, dK += scale dS^T Q.
template <int DMAX>
__global__ void __launch_bounds__(kBlockThreads)
    k_attn_dkdv_tc(AttnArgs a, const float* dout, const float* lse, const float* delta, float* dk,
                   float* dv) {
  using L = Ld<DMAX>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kTile * L::h;
  bf16* Qs = Vs + kTile * L::h;
  bf16* Gs = Qs + kTile * L::h;  // dO
  float* Sw = reinterpret_cast<float*>(Gs + kTile * L::h);
  float* Dw = Sw + kWarps * 16 * L::s;
  bf16* Pw = reinterpret_cast<bf16*>(Dw + kWarps * 16 * L::s);
  bf16* Tw = Pw + kWarps * 16 * L::p;  // dS^T
  float* L2 = reinterpret_cast<float*>(Tw + kWarps * 16 * L::p);
  float* Dl = L2 + kTile;

  const int seq = a.k_items[2 * blockIdx.x], kt = a.k_items[2 * blockIdx.x + 1];
  const int kvh = blockIdx.y, group = a.Hq / a.Hkv;
  const int start = a.cu[seq], len = a.cu[seq + 1] - start;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k_first = kt * kRows, wk0 = k_first + warp * 16;
  float* S = Sw + warp * 16 * L::s;
  float* Dp = Dw + warp * 16 * L::s;
  bf16* P = Pw + warp * 16 * L::p;
  bf16* T = Tw + warp * 16 * L::p;
  const int r = lane / 2, half = lane % 2;
  const int kj = wk0 + r;
  const float c = a.scale * kLog2e;
  const int64_t ldo = int64_t{a.Hq} * a.D;

  load_tile<DMAX>(Ks, a.k + int64_t{start} * a.ld + int64_t{kvh} * a.D, a.ld, k_first, len, a.D,
                  a.vec4);
  load_tile<DMAX>(Vs, a.v + int64_t{start} * a.ld + int64_t{kvh} * a.D, a.ld, k_first, len, a.D,
                  a.vec4);
  FragC ak[DMAX / 16], av[DMAX / 16];
#pragma unroll
  for (int jd = 0; jd < DMAX / 16; ++jd) {
    wmma::fill_fragment(ak[jd], 0.f);
    wmma::fill_fragment(av[jd], 0.f);
  }
  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    // Causal: queries before the block's first key see none of its keys.
    for (int q0 = k_first; q0 < len; q0 += kTile) {
      __syncthreads();
      load_tile<DMAX>(Qs, a.q + int64_t{start} * a.ld + int64_t{h} * a.D, a.ld, q0, len, a.D,
                      a.vec4);
      load_tile<DMAX>(Gs, dout + int64_t{start} * ldo + int64_t{h} * a.D, ldo, q0, len, a.D,
                      a.vec4);
      for (int i = threadIdx.x; i < kTile; i += kBlockThreads) {
        const bool in = q0 + i < len;
        const int64_t row = start + q0 + i;
        L2[i] = in ? lse[row * a.Hq + h] * kLog2e : INFINITY;
        Dl[i] = in ? delta[row * a.Hq + h] : 0.f;
      }
      __syncthreads();
      if (wk0 >= len) continue;                         // this warp's keys are past the sequence
      warp_abt<DMAX>(S, Ks + (warp * 16) * L::h, Qs);   // S^T: keys x queries
      warp_abt<DMAX>(Dp, Vs + (warp * 16) * L::h, Gs);  // dP^T
      __syncwarp();
      const float* srow = S + r * L::s + half * 32;
      const float* drow = Dp + r * L::s + half * 32;
      bf16* prow = P + r * L::p + half * 32;
      bf16* trow = T + r * L::p + half * 32;
#pragma unroll 8
      for (int j = 0; j < 32; ++j) {
        const int col = half * 32 + j, qi = q0 + col;
        const float p = kj < len && qi < len && qi >= kj ? exp2f(srow[j] * c - L2[col]) : 0.f;
        prow[j] = __float2bfloat16_rn(p);
        trow[j] = __float2bfloat16_rn(p * (drow[j] - Dl[col]));
      }
      __syncwarp();
#pragma unroll
      for (int jd = 0; jd < DMAX / 16; ++jd) {
        warp_pt<DMAX>(av[jd], P, Gs, jd);
        warp_pt<DMAX>(ak[jd], T, Qs, jd);
      }
    }
  }
  if (wk0 >= len) return;
  const int64_t base = int64_t{start + wk0} * a.ld + int64_t{kvh} * a.D;
  warp_store<DMAX>(dk + base, a.ld, len - wk0, a.D, ak, a.scale, S);
  warp_store<DMAX>(dv + base, a.ld, len - wk0, a.D, av, 1.f, S);
}

// Opts a kernel into more than 48 KiB of dynamic shared memory (once per kernel).
template <typename K>
void allow_smem(K kernel, size_t bytes) {
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
}

template <int DMAX>
void launch_fwd_tc(cudaStream_t st, const AttnArgs& a, float* out, float* lse) {
  static const bool once = (allow_smem(k_attn_fwd_tc<DMAX>, fwd_smem<DMAX>()), true);
  (void)once;
  k_attn_fwd_tc<DMAX><<<dim3(a.n_q_items, a.Hq), kBlockThreads, fwd_smem<DMAX>(), st>>>(a, out, lse);
  LOOM_CUDA_LAUNCHED("attention_forward (tensor cores)");
}

template <int DMAX>
void launch_bwd_tc(cudaStream_t st, const AttnArgs& a, const float* lse, const float* dout,
                   float* dq, float* dk, float* dv, const float* delta) {
  static const bool once = (allow_smem(k_attn_dkdv_tc<DMAX>, bwd_smem<DMAX>()),
                            allow_smem(k_attn_dq_tc<DMAX>, bwd_smem<DMAX>()), true);
  (void)once;
  if (a.n_k_items > 0) {
    k_attn_dkdv_tc<DMAX>
        <<<dim3(a.n_k_items, a.Hkv), kBlockThreads, bwd_smem<DMAX>(), st>>>(a, dout, lse, delta, dk, dv);
    LOOM_CUDA_LAUNCHED("attention_backward (dk, dv; tensor cores)");
  }
  k_attn_dq_tc<DMAX>
      <<<dim3(a.n_q_items, a.Hq), kBlockThreads, bwd_smem<DMAX>(), st>>>(a, dout, lse, delta, dq);
  LOOM_CUDA_LAUNCHED("attention_backward (dq; tensor cores)");
}

}  // namespace

bool attention_tc_supported(int D) {
  return D > 0 && D % 16 == 0 && D <= 128;
}

void attention_forward_tc(cudaStream_t st, const AttnArgs& a, float* out, float* lse) {
  if (a.n_q_items == 0) return;
  if (a.D <= 64) return launch_fwd_tc<64>(st, a, out, lse);
  return launch_fwd_tc<128>(st, a, out, lse);
}

void attention_backward_tc(cudaStream_t st, const AttnArgs& a, const float* out, const float* lse,
                           const float* dout, float* dq, float* dk, float* dv, float* delta) {
  if (a.n_q_items == 0) return;
  attention_delta(st, a, out, dout, delta);
  if (a.D <= 64) return launch_bwd_tc<64>(st, a, lse, dout, dq, dk, dv, delta);
  return launch_bwd_tc<128>(st, a, lse, dout, dq, dk, dv, delta);
}

}  // namespace loom::cuda
