// The serving engine's attention over the paged KV cache on the GPU: a straightforward kernel,
// correct first. The write copies one new row per block (rounded to bf16 for a bf16 pool). The
// attention runs one block per (query row, query head): its four warps take every fourth
// cached position, each keeping an online softmax (running max, sum and the weighted values,
// 8 dims per lane), and the warps' partial results are merged at the end by their maxima. A
// decode batch of B sequences is B x Hq blocks; a prefill chunk of n tokens n x Hq.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/paged_attention.h"

namespace loom::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kPerLane = kPagedMaxHeadDim / 32;

// e null: another thread of the block records it.
__device__ void record_paged_error(DeviceError* e, int code, int op, int row, int value) {
  if (e && atomicCAS(&e->code, 0, code) == 0) {
    e->op = op;
    e->row = row;
    e->value = value;
  }
}

// The chunk holding row r (chunks in row order; a linear scan: a step has few chunks).
__device__ int chunk_of_row(const int32_t* t, int nchunks, int r) {
  int s = 0;
  while (s + 1 < nchunks && t[(s + 1) * kPagedChunkInts + kPagedRow0] <= r) ++s;
  return s;
}

// Element offset of (position p, kv head 0, dim 0) of chunk `f`'s sequence, or -1 after
// recording why it is not in the pool.
__device__ int64_t slot_base(const int32_t* t, const int32_t* f, const PagedKvBuffers& c, int p,
                             int op, int chunk, DeviceError* err) {
  const int idx = p / c.block_size;
  if (idx >= f[kPagedBlocks]) {
    record_paged_error(err, kErrPagedTable, op, chunk, p);
    return -1;
  }
  const int b = t[f[kPagedTable] + idx];
  if (b < 0 || b >= c.num_blocks) {
    record_paged_error(err, kErrBlockRange, op, chunk, b);
    return -1;
  }
  return (int64_t(b) * c.block_size + p % c.block_size) * c.n_kv_head * c.head_dim;
}

__device__ __forceinline__ float load_kv(const void* base, bool bf16, int64_t i) {
  if (!bf16) return static_cast<const float*>(base)[i];
  return __uint_as_float(uint32_t(static_cast<const uint16_t*>(base)[i]) << 16);
}

// Round to nearest even, NaN kept quiet (core/dtype.h's f32_to_bf16, bit for bit).
__device__ __forceinline__ uint16_t to_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__global__ void k_paged_kv_write(PagedKvBuffers c, const float* k_new, const float* v_new, int ld,
                                 const int32_t* t, int nchunks, DeviceError* err) {
  const int r = blockIdx.x;
  const int s = chunk_of_row(t, nchunks, r);
  const int32_t* f = t + s * kPagedChunkInts;
  const int p = f[kPagedStart] + (r - f[kPagedRow0]);
  // Every thread computes the same offset; one records an error.
  const int64_t off = slot_base(t, f, c, p, kOpPagedKvWrite, s, threadIdx.x == 0 ? err : nullptr);
  if (off < 0) return;
  const int HD = c.n_kv_head * c.head_dim;
  const float* kr = k_new + int64_t(r) * ld;
  const float* vr = v_new + int64_t(r) * ld;
  for (int i = threadIdx.x; i < HD; i += blockDim.x) {
    if (c.dtype == DType::BF16) {
      static_cast<uint16_t*>(c.k)[off + i] = to_bf16(kr[i]);
      static_cast<uint16_t*>(c.v)[off + i] = to_bf16(vr[i]);
    } else {
      static_cast<float*>(c.k)[off + i] = kr[i];
      static_cast<float*>(c.v)[off + i] = vr[i];
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    k_paged_attention(float* out, const float* q, int ldq, PagedKvBuffers c, const int32_t* t,
                      int nchunks, int Hq, float scale, DeviceError* err) {
  const int r = blockIdx.x, hq = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = c.head_dim, Hkv = c.n_kv_head;
  const int hk = hq / (Hq / Hkv);
  const bool bf16 = c.dtype == DType::BF16;
  const int s = chunk_of_row(t, nchunks, r);
  const int32_t* f = t + s * kPagedChunkInts;
  const int L = f[kPagedStart] + (r - f[kPagedRow0]) + 1;  // causal: positions [0, L)

  float qv[kPerLane], acc[kPerLane];
  const float* qr = q + int64_t(r) * ldq + int64_t(hq) * D;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < D ? qr[d] : 0.f;
    acc[j] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int p = warp; p < L; p += kWarps) {
    const int64_t base = slot_base(t, f, c, p, kOpPagedAttention, s, lane == 0 ? err : nullptr);
    if (base < 0) continue;  // recorded: the step fails at the next sync
    const int64_t off = base + int64_t(hk) * D;
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < D) dot = fmaf(qv[j], load_kv(c.k, bf16, off + d), dot);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float sc = dot * scale;
    const float m_new = fmaxf(m, sc);
    const float corr = expf(m - m_new);  // 0 for the first position (m = -inf)
    const float e = expf(sc - m_new);
    l = l * corr + e;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < D) acc[j] = acc[j] * corr + e * load_kv(c.v, bf16, off + d);
    }
    m = m_new;
  }

  // Merge the warps' partial softmaxes by their maxima.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kPagedMaxHeadDim];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < D) sacc[warp][d] = acc[j];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float wsum[kWarps];
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    wsum[w] = sl[w] > 0.f ? expf(sm[w] - M) : 0.f;  // a warp with no position adds nothing
    total += sl[w] * wsum[w];
  }
  float* o = out + int64_t(r) * Hq * D + int64_t(hq) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float x = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (wsum[w] > 0.f) x += sacc[w][d] * wsum[w];
    o[d] = x / total;
  }
}

void check_cache(const PagedKvBuffers& c, const char* op) {
  LOOM_CHECK(c.dtype == DType::F32 || c.dtype == DType::BF16, op,
             ": the KV cache stores fp32 or bf16, not ", dtype_name(c.dtype));
  LOOM_CHECK(c.k && c.v && c.block_size > 0 && c.n_kv_head > 0 && c.num_blocks > 0 &&
                 c.head_dim > 0 && c.head_dim <= kPagedMaxHeadDim,
             op, ": bad cache shape (", c.num_blocks, " blocks of ", c.block_size, ", ",
             c.n_kv_head, " kv heads of ", c.head_dim, " dims; at most ", kPagedMaxHeadDim, ")");
}

}  // namespace

void paged_kv_write(cudaStream_t st, const PagedKvBuffers& c, const float* k_new,
                    const float* v_new, int ld, const int32_t* chunks, int nchunks, int rows,
                    DeviceError* err) {
  check_cache(c, "paged_kv_write");
  LOOM_CHECK(ld >= c.n_kv_head * c.head_dim, "paged_kv_write: row stride ", ld,
             " below n_kv_head * head_dim ", c.n_kv_head * c.head_dim);
  LOOM_CHECK(nchunks > 0 || rows == 0, "paged_kv_write: ", rows, " rows in no chunk");
  if (rows == 0) return;
  k_paged_kv_write<<<rows, 128, 0, st>>>(c, k_new, v_new, ld, chunks, nchunks, err);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void paged_attention(cudaStream_t st, float* out, const float* q, int ldq, const PagedKvBuffers& c,
                     const int32_t* chunks, int nchunks, int rows, int Hq, float scale,
                     DeviceError* err) {
  check_cache(c, "paged_attention");
  LOOM_CHECK(Hq > 0 && Hq % c.n_kv_head == 0, "paged attention: ", Hq, " query heads over ",
             c.n_kv_head, " kv heads");
  LOOM_CHECK(ldq >= Hq * c.head_dim, "paged attention: q row stride ", ldq, " below Hq * D ",
             Hq * c.head_dim);
  LOOM_CHECK(Hq <= 65535, "paged attention: ", Hq, " query heads exceed the grid");
  LOOM_CHECK(nchunks > 0 || rows == 0, "paged attention: ", rows, " rows in no chunk");
  if (rows == 0) return;
  k_paged_attention<<<dim3(rows, Hq), kWarps * 32, 0, st>>>(out, q, ldq, c, chunks, nchunks, Hq,
                                                            scale, err);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::cuda
