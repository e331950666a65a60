// Every CUDA kernel of the backend except attention: pointwise ops, norms, softmax, fused
// softmax + cross-entropy, RoPE, embedding, AdamW and the reductions. One translation unit
// keeps the build to a few nvcc invocations.
//
// Determinism: no floating-point atomics anywhere. Reductions over rows (parameter gradients)
// cut the rows into a number of chunks that depends only on N, reduce each chunk in a fixed
// order, then add the chunk partials in chunk order; block reductions are fixed trees.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace loom::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// Elements of an int32 scratch array, rounded up so the next array stays 256-byte aligned.
inline size_t align_n(int N) {
  return (static_cast<size_t>(N) + 63) / 64 * 64;
}
constexpr float kGeluCubic = 0.044715f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Block-wide sum / max (blockDim.x a multiple of 32, at most 1024), result in every thread.
__device__ float block_sum(float v) {
  __shared__ float sh[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.f;
  return warp_sum(v);
}
__device__ float block_max(float v) {
  __shared__ float sh[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -INFINITY;
  return warp_max(v);
}
__device__ double block_sum_d(double v) {
  __shared__ double sh[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.0;
  return warp_sum_d(v);
}

__device__ __forceinline__ float sigmoidf(float x) {
  return 1.f / (1.f + expf(-x));
}

__device__ void record_error(DeviceError* e, int code, int op, int row, int value) {
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->op = op;
    e->row = row;
    e->value = value;
  }
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// ------------------------------------------------------------------------------ pointwise

__global__ void k_gelu_fwd(float* out, const float* inp, int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = x * sigmoidf(2.f * u);
  }
}

__global__ void k_gelu_bwd(float* dinp, const float* inp, const float* dout, int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float s = sigmoidf(2.f * u);
    const float du = kSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
    dinp[i] = dout[i] * (s + 2.f * x * s * (1.f - s) * du);
  }
}

__global__ void k_swiglu_fwd(float* out, const float* inp, int N, int F) {
  const int64_t n = int64_t{N} * F;
  GRID_STRIDE(idx, n) {
    const int64_t i = idx / F, j = idx % F;
    const float g = inp[i * 2 * F + j], u = inp[i * 2 * F + F + j];
    out[idx] = g * sigmoidf(g) * u;
  }
}

__global__ void k_swiglu_bwd(float* dinp, const float* inp, const float* dout, int N, int F) {
  const int64_t n = int64_t{N} * F;
  GRID_STRIDE(idx, n) {
    const int64_t i = idx / F, j = idx % F;
    const float g = inp[i * 2 * F + j], u = inp[i * 2 * F + F + j];
    const float d = dout[idx];
    const float s = sigmoidf(g);
    dinp[i * 2 * F + j] = d * u * s * (1.f + g * (1.f - s));
    dinp[i * 2 * F + F + j] = d * g * s;
  }
}

__global__ void k_add(float* out, const float* a, const float* b, int64_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void k_add_inplace(float* acc, const float* x, int64_t n) {
  GRID_STRIDE(i, n) acc[i] += x[i];
}
__global__ void k_scale(float* x, float s, int64_t n) {
  GRID_STRIDE(i, n) x[i] *= s;
}
__global__ void k_bit_mask(float* out, const float* x, const uint64_t* bits, int C, int64_t words,
                           float scale, int64_t n) {
  GRID_STRIDE(i, n) {
    const int64_t row = i / C;
    const int c = int(i % C);
    out[i] = (bits[row * words + (c >> 6)] >> (c & 63)) & 1 ? x[i] * scale : 0.f;
  }
}
__global__ void k_fill(float* x, float v, int64_t n) {
  GRID_STRIDE(i, n) x[i] = v;
}
__global__ void k_scale_matrix(float* C, int M, int N, int ldc, float beta) {
  const int64_t n = int64_t{M} * N;
  GRID_STRIDE(idx, n) {
    float& c = C[(idx / N) * ldc + idx % N];
    c = beta == 0.f ? 0.f : beta * c;
  }
}

// Conversions, round to nearest even. fp8: saturating to the largest finite value (as core's
// f32_to_e4m3 / f32_to_e5m2), but e5m2 keeps infinities (core does too).
__device__ __forceinline__ float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::F8E4M3: {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<const __nv_fp8_storage_t*>(p)[i];
      return static_cast<float>(v);
    }
    case DType::F8E5M2: {
      __nv_fp8_e5m2 v;
      v.__x = static_cast<const __nv_fp8_storage_t*>(p)[i];
      return static_cast<float>(v);
    }
    default:
      return 0.f;
  }
}
__device__ __forceinline__ void store_from_float(void* p, DType t, int64_t i, float x) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = x;
      break;
    case DType::BF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
      break;
    case DType::F16:
      static_cast<__half*>(p)[i] = __float2half_rn(x);
      break;
    case DType::F8E4M3:
      static_cast<__nv_fp8_storage_t*>(p)[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      break;
    case DType::F8E5M2:
      static_cast<__nv_fp8_storage_t*>(p)[i] =
          isinf(x) ? (x > 0 ? 0x7c : 0xfc) : __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
      break;
    default:
      break;
  }
}

__global__ void k_convert(void* dst, DType dt, const void* src, DType st, int64_t n) {
  GRID_STRIDE(i, n) store_from_float(dst, dt, i, load_as_float(src, st, i));
}

__global__ void k_round_to(DType t, float* x, int64_t n) {
  GRID_STRIDE(i, n) {
    // One element through a register-sized buffer of the narrow type and back.
    unsigned short buf = 0;
    store_from_float(&buf, t, 0, x[i]);
    x[i] = load_as_float(&buf, t, 0);
  }
}

// ------------------------------------------------------------------------------ RoPE
// One thread per (token, head, pair). Angles in double, as the CPU backend, so forward and
// backward are exact inverses up to float rounding and large positions lose no precision.
__global__ void k_rope(float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
                       float sign, DeviceError* err, int op) {
  const int half = D / 2;
  const int64_t n = int64_t{N} * H * half;
  const double log_theta = log(static_cast<double>(theta));
  GRID_STRIDE(idx, n) {
    const int j = static_cast<int>(idx % half);
    const int64_t th = idx / half;
    const int h = static_cast<int>(th % H);
    const int64_t i = th / H;
    const int p = pos[i];
    if (p < 0) {
      if (h == 0 && j == 0) record_error(err, kErrNegativePos, op, static_cast<int>(i), p);
      continue;
    }
    const double inv_freq = exp(-2.0 * j / D * log_theta);
    double s, c;
    sincos(static_cast<double>(p) * inv_freq, &s, &c);
    const float cs = static_cast<float>(c), sn = sign * static_cast<float>(s);
    float* x1 = x + i * ld + int64_t{h} * D + j;
    float* x2 = x1 + half;
    const float a = *x1, b = *x2;
    *x1 = a * cs - b * sn;
    *x2 = b * cs + a * sn;
  }
}

// ------------------------------------------------------------------------------ softmax

__global__ void k_softmax_fwd(float* out, const float* inp, int cols) {
  const float* x = inp + int64_t{blockIdx.x} * cols;
  float* y = out + int64_t{blockIdx.x} * cols;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_max(m);
  if (m == -INFINITY) {  // fully masked row
    __syncthreads();
    for (int j = threadIdx.x; j < cols; j += blockDim.x) y[j] = 0.f;
    return;
  }
  float s = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(x[j] - m);
  const float inv = 1.f / block_sum(s);  // every read of x precedes the writes (out may alias)
  for (int j = threadIdx.x; j < cols; j += blockDim.x) y[j] = expf(x[j] - m) * inv;
}

__global__ void k_softmax_bwd(float* dinp, const float* out, const float* dout, int cols) {
  const int64_t off = int64_t{blockIdx.x} * cols;
  const float *y = out + off, *dy = dout + off;
  float* dx = dinp + off;
  float s = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) s += y[j] * dy[j];
  const float dot = block_sum(s);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) dx[j] = y[j] * (dy[j] - dot);
}

// ------------------------------------------------------------------------------ cross-entropy
// One block per row: an online (max, sum of exp) pass, a block combine, then the gradient
// pass. dlogits may alias logits: the target logit is read first, and every thread has read
// its logits for the reduction before the block-wide barrier that precedes any write.
__device__ __forceinline__ void combine_ms(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float M = fmaxf(m, m2);
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

__global__ void k_cross_entropy(float* losses, float* dlogits, const float* logits,
                                const int32_t* targets, int V, float dloss, const float* weights,
                                DeviceError* err) {
  const int row = blockIdx.x;
  const float* x = logits + int64_t{row} * V;
  float* dx = dlogits ? dlogits + int64_t{row} * V : nullptr;
  int t = targets[row];
  if (t >= V) {
    if (threadIdx.x == 0) record_error(err, kErrTargetRange, kOpCrossEntropy, row, t);
    t = -1;
  }
  if (t < 0) {  // ignored row
    if (threadIdx.x == 0 && losses) losses[row] = 0.f;
    if (dx)
      for (int j = threadIdx.x; j < V; j += blockDim.x) dx[j] = 0.f;
    return;
  }
  const float xt = x[t];
  float m = -INFINITY, s = 0.f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = x[j];
    if (v > m) {
      s = s * expf(m - v) + 1.f;  // m == -inf: s was 0
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  // Block combine of (m, s) pairs in a fixed order.
  __shared__ float sm[32], ss[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(kFull, m, o), s2 = __shfl_xor_sync(kFull, s, o);
    combine_ms(m, s, m2, s2);
  }
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  m = lane < nw ? sm[lane] : -INFINITY;
  s = lane < nw ? ss[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(kFull, m, o), s2 = __shfl_xor_sync(kFull, s, o);
    combine_ms(m, s, m2, s2);
  }
  if (threadIdx.x == 0 && losses) losses[row] = logf(s) + m - xt;
  if (!dx) return;
  const float w = weights ? dloss * weights[row] : dloss;  // per-row weight (DPO, GRPO, masks)
  const float scale = w / s;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float g = expf(x[j] - m) * scale;
    if (j == t) g -= w;
    dx[j] = g;
  }
}

// ------------------------------------------------------------------------------ norms
// Forward: one warp per row, two passes (mean, then centred squares) as the CPU backend.
constexpr int kRowsPerBlock = kThreads / 32;

__global__ void k_layernorm_fwd(float* out, float* mean, float* rstd, const float* inp,
                                const float* w, const float* b, int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + int64_t{row} * C;
  float* y = out + int64_t{row} * C;
  float s = 0.f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0.f;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float r = 1.f / sqrtf(warp_sum(v) / C + eps);
  for (int c = lane; c < C; c += 32) y[c] = (x[c] - m) * r * w[c] + (b ? b[c] : 0.f);
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

__global__ void k_rmsnorm_fwd(float* out, float* rstd, const float* inp, const float* w, int N,
                              int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + int64_t{row} * C;
  float* y = out + int64_t{row} * C;
  float s = 0.f;
  for (int c = lane; c < C; c += 32) s += x[c] * x[c];
  const float r = 1.f / sqrtf(warp_sum(s) / C + eps);
  for (int c = lane; c < C; c += 32) y[c] = x[c] * r * w[c];
  if (lane == 0 && rstd) rstd[row] = r;
}

// Column partials: block (32 columns x 8 row lanes) per (column block, row chunk). MODE 0:
// sum dout (bias); 1: LayerNorm (dout * n, dout); 2: RMSNorm (dout * x * rstd).
template <int MODE>
__global__ void k_colred_partial(float* partial, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int N, int C, int chunks) {
  constexpr int kOut = MODE == 1 ? 2 : 1;
  __shared__ float sh[kOut][8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int chunk = blockIdx.y;
  const int r0 = static_cast<int>(int64_t{N} * chunk / chunks);
  const int r1 = static_cast<int>(int64_t{N} * (chunk + 1) / chunks);
  float a0 = 0.f, a1 = 0.f;
  if (c < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      const int64_t i = int64_t{r} * C + c;
      const float d = dout[i];
      if constexpr (MODE == 0) {
        a0 += d;
      } else if constexpr (MODE == 1) {
        a0 += d * ((inp[i] - mean[r]) * rstd[r]);
        a1 += d;
      } else {
        a0 += d * inp[i] * rstd[r];
      }
    }
  }
  sh[0][threadIdx.y][threadIdx.x] = a0;
  if constexpr (kOut == 2) sh[kOut - 1][threadIdx.y][threadIdx.x] = a1;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int o = 0; o < kOut; ++o) {
      float s = 0.f;
      for (int y = 0; y < 8; ++y) s += sh[o][y][threadIdx.x];
      partial[(int64_t{chunk} * kOut + o) * C + c] = s;
    }
  }
}

// dst_o[c] += sum over chunks (in order) of partial[chunk][o][c].
__global__ void k_colred_finish(float* dst0, float* dst1, const float* partial, int chunks,
                                int nout, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* dst[2] = {dst0, dst1};
  for (int o = 0; o < nout; ++o) {
    if (!dst[o]) continue;
    float s = 0.f;
    for (int k = 0; k < chunks; ++k) s += partial[(int64_t{k} * nout + o) * C + c];
    dst[o][c] += s;
  }
}

// dinp rows: one warp per row. dinp may alias dout: each lane reads dout[c] for both row
// reductions before it writes dinp[c] at the same c.
__global__ void k_layernorm_dinp(float* dinp, const float* dout, const float* inp, const float* w,
                                 const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const int64_t off = int64_t{row} * C;
  const float m = mean[row], s = rstd[row];
  float g = 0.f, gn = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float d = dout[off + c] * w[c];
    g += d;
    gn += d * ((inp[off + c] - m) * s);
  }
  g = warp_sum(g) / C;
  gn = warp_sum(gn) / C;
  for (int c = lane; c < C; c += 32) {
    const float n = (inp[off + c] - m) * s;
    dinp[off + c] = s * (dout[off + c] * w[c] - g - n * gn);
  }
}

__global__ void k_rmsnorm_dinp(float* dinp, const float* dout, const float* inp, const float* w,
                               const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const int64_t off = int64_t{row} * C;
  const float r = rstd[row];
  float gx = 0.f;
  for (int c = lane; c < C; c += 32) gx += dout[off + c] * w[c] * inp[off + c];
  const float k = r * r * (warp_sum(gx) / C);
  for (int c = lane; c < C; c += 32) dinp[off + c] = r * (dout[off + c] * w[c] - inp[off + c] * k);
}

// ------------------------------------------------------------------------------ embedding

__global__ void k_embedding_fwd(float* out, const int32_t* ids, const float* table, int N, int C,
                                bool accumulate, DeviceError* err) {
  const int64_t n = int64_t{N} * C;
  GRID_STRIDE(idx, n) {
    const int64_t i = idx / C, c = idx % C;
    const int id = ids[i];
    if (id < 0) {
      if (c == 0) record_error(err, kErrNegativeId, kOpEmbeddingForward, static_cast<int>(i), id);
      continue;
    }
    const float v = table[int64_t{id} * C + c];
    out[idx] = accumulate ? out[idx] + v : v;
  }
}

__global__ void k_embedding_keys(int32_t* keys, int32_t* vals, const int32_t* ids, int N,
                                 DeviceError* err) {
  GRID_STRIDE(i, N) {
    const int id = ids[i];
    if (id < 0) record_error(err, kErrNegativeId, kOpEmbeddingBackward, static_cast<int>(i), id);
    keys[i] = id;
    vals[i] = static_cast<int32_t>(i);
  }
}

// One block per run of equal ids in the (stably) sorted order: the run's rows are summed in
// their original order, then added to the table row once. Deterministic, no atomics.
__global__ void k_embedding_runs(float* dtable, const float* dout, const int32_t* keys,
                                 const int32_t* rows, int N, int C) {
  const int p = blockIdx.x;
  const int id = keys[p];
  if (id < 0 || (p > 0 && keys[p - 1] == id)) return;
  int end = p + 1;
  while (end < N && keys[end] == id) ++end;
  float* drow = dtable + int64_t{id} * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int q = p; q < end; ++q) acc += dout[int64_t{rows[q]} * C + c];
    drow[c] += acc;
  }
}

// ------------------------------------------------------------------------------ AdamW

__device__ __forceinline__ void adamw_one(float* p, const float* g, float* m, float* v, int64_t i,
                                          float lr, float b1, float b2, float eps, float wd,
                                          float gs, float c1, float c2) {
  const float gi = g[i] * gs;
  const float mi = b1 * m[i] + (1.f - b1) * gi;
  const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float pi = p[i];
  p[i] = pi - lr * ((mi * c1) / (sqrtf(vi * c2) + eps) + wd * pi);
}

__global__ void k_adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1,
                        float b2, float eps, float wd, float gs, float c1, float c2) {
  GRID_STRIDE(i, n) adamw_one(p, g, m, v, i, lr, b1, b2, eps, wd, gs, c1, c2);
}

__global__ void k_adamw_multi(const MtTensor* tensors, const MtChunk* chunks, float lr, float b1,
                              float b2, float eps, float gs, float c1, float c2) {
  const MtChunk ch = chunks[blockIdx.x];
  const MtTensor t = tensors[ch.tensor];
  for (int64_t i = ch.offset + threadIdx.x; i < ch.offset + ch.len; i += blockDim.x)
    adamw_one(t.param, t.grad, t.m, t.v, i, lr, b1, b2, eps, t.weight_decay, gs, c1, c2);
}

// ------------------------------------------------------------------------------ reductions

__global__ void k_sumsq_partial(const float* x, int64_t n, double* partial) {
  double acc = 0.0;
  GRID_STRIDE(i, n) {
    const double d = x[i];
    acc += d * d;
  }
  acc = block_sum_d(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void k_sumsq_finish(const double* partial, int nblocks, double* result,
                               bool accumulate) {
  double acc = 0.0;
  for (int b = threadIdx.x; b < nblocks; b += blockDim.x) acc += partial[b];
  acc = block_sum_d(acc);
  if (threadIdx.x == 0) *result = accumulate ? *result + acc : acc;
}

// One block: each thread adds a fixed stride of the elements, then a fixed tree; the order does
// not depend on the launch, so the sum is reproducible (a loss sum: N is at most a few 10^4).
__global__ void k_weighted_sum(const float* x, const float* w, int64_t n, double* result) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    acc += w ? double(w[i]) * double(x[i]) : double(x[i]);
  acc = block_sum_d(acc);
  if (threadIdx.x == 0) *result = acc;
}

__global__ void k_all_finite(const float* x, int64_t n, int* bad) {
  GRID_STRIDE(i, n) {
    if ((__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) *bad = 1;
  }
}

}  // namespace

// ================================================================================ launchers

void gelu_forward(cudaStream_t st, float* out, const float* inp, int64_t n) {
  if (n <= 0) return;
  k_gelu_fwd<<<grid_1d(n), kThreads, 0, st>>>(out, inp, n);
  LOOM_CUDA_LAUNCHED("gelu_forward");
}
void gelu_backward(cudaStream_t st, float* dinp, const float* inp, const float* dout, int64_t n) {
  if (n <= 0) return;
  k_gelu_bwd<<<grid_1d(n), kThreads, 0, st>>>(dinp, inp, dout, n);
  LOOM_CUDA_LAUNCHED("gelu_backward");
}
void swiglu_forward(cudaStream_t st, float* out, const float* inp, int N, int F) {
  if (int64_t{N} * F <= 0) return;
  k_swiglu_fwd<<<grid_1d(int64_t{N} * F), kThreads, 0, st>>>(out, inp, N, F);
  LOOM_CUDA_LAUNCHED("swiglu_forward");
}
void swiglu_backward(cudaStream_t st, float* dinp, const float* inp, const float* dout, int N,
                     int F) {
  if (int64_t{N} * F <= 0) return;
  k_swiglu_bwd<<<grid_1d(int64_t{N} * F), kThreads, 0, st>>>(dinp, inp, dout, N, F);
  LOOM_CUDA_LAUNCHED("swiglu_backward");
}
void add(cudaStream_t st, float* out, const float* a, const float* b, int64_t n) {
  if (n <= 0) return;
  k_add<<<grid_1d(n), kThreads, 0, st>>>(out, a, b, n);
  LOOM_CUDA_LAUNCHED("add");
}
void add_inplace(cudaStream_t st, float* acc, const float* x, int64_t n) {
  if (n <= 0) return;
  k_add_inplace<<<grid_1d(n), kThreads, 0, st>>>(acc, x, n);
  LOOM_CUDA_LAUNCHED("add_inplace");
}
void scale_inplace(cudaStream_t st, float* x, float s, int64_t n) {
  if (n <= 0) return;
  k_scale<<<grid_1d(n), kThreads, 0, st>>>(x, s, n);
  LOOM_CUDA_LAUNCHED("scale_inplace");
}
void apply_bit_mask(cudaStream_t st, float* out, const float* x, const uint64_t* bits, int N,
                    int C, float scale) {
  const int64_t n = int64_t(N) * C;
  if (n <= 0) return;
  k_bit_mask<<<grid_1d(n), kThreads, 0, st>>>(out, x, bits, C, (int64_t(C) + 63) / 64, scale, n);
  LOOM_CUDA_LAUNCHED("apply_bit_mask");
}
void fill(cudaStream_t st, float* x, float value, int64_t n) {
  if (n <= 0) return;
  k_fill<<<grid_1d(n), kThreads, 0, st>>>(x, value, n);
  LOOM_CUDA_LAUNCHED("fill");
}
void scale_matrix(cudaStream_t st, float* C, int M, int N, int ldc, float beta) {
  if (int64_t{M} * N <= 0) return;
  k_scale_matrix<<<grid_1d(int64_t{M} * N), kThreads, 0, st>>>(C, M, N, ldc, beta);
  LOOM_CUDA_LAUNCHED("scale_matrix");
}
void round_to(cudaStream_t st, DType t, float* x, int64_t n) {
  LOOM_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3 ||
                 t == DType::F8E5M2,
             "round_to (cuda): unsupported dtype ", dtype_name(t));
  if (n <= 0 || t == DType::F32) return;
  k_round_to<<<grid_1d(n), kThreads, 0, st>>>(t, x, n);
  LOOM_CUDA_LAUNCHED("round_to");
}
void convert(cudaStream_t st, void* dst, DType dt, const void* src, DType st_type, int64_t n) {
  auto ok = [](DType t) {
    return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3 ||
           t == DType::F8E5M2;
  };
  LOOM_CHECK(ok(dt) && ok(st_type), "convert (cuda): unsupported dtypes ", dtype_name(st_type),
             " -> ", dtype_name(dt));
  if (n <= 0) return;
  k_convert<<<grid_1d(n), kThreads, 0, st>>>(dst, dt, src, st_type, n);
  LOOM_CUDA_LAUNCHED("convert");
}

void rope(cudaStream_t st, float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
          float sign, DeviceError* err, int op) {
  const int64_t n = int64_t{N} * H * (D / 2);
  if (n <= 0) return;
  k_rope<<<grid_1d(n), kThreads, 0, st>>>(x, pos, N, H, D, ld, theta, sign, err, op);
  LOOM_CUDA_LAUNCHED("rope");
}

void softmax_forward(cudaStream_t st, float* out, const float* inp, int rows, int cols) {
  if (rows <= 0 || cols <= 0) return;
  k_softmax_fwd<<<rows, kThreads, 0, st>>>(out, inp, cols);
  LOOM_CUDA_LAUNCHED("softmax_forward");
}
void softmax_backward(cudaStream_t st, float* dinp, const float* out, const float* dout, int rows,
                      int cols) {
  if (rows <= 0 || cols <= 0) return;
  k_softmax_bwd<<<rows, kThreads, 0, st>>>(dinp, out, dout, cols);
  LOOM_CUDA_LAUNCHED("softmax_backward");
}

void cross_entropy(cudaStream_t st, float* losses, float* dlogits, const float* logits,
                   const int32_t* targets, int N, int V, float dloss, const float* weights,
                   DeviceError* err) {
  if (N <= 0) return;
  k_cross_entropy<<<N, 512, 0, st>>>(losses, dlogits, logits, targets, V, dloss, weights, err);
  LOOM_CUDA_LAUNCHED("cross_entropy");
}

void layernorm_forward(cudaStream_t st, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  k_layernorm_fwd<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, st>>>(
      out, mean, rstd, inp, weight, bias, N, C, eps);
  LOOM_CUDA_LAUNCHED("layernorm_forward");
}

void rmsnorm_forward(cudaStream_t st, float* out, float* rstd, const float* inp,
                     const float* weight, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  k_rmsnorm_fwd<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, st>>>(out, rstd, inp,
                                                                              weight, N, C, eps);
  LOOM_CUDA_LAUNCHED("rmsnorm_forward");
}

namespace {
template <int MODE>
void colred(cudaStream_t st, float* dst0, float* dst1, const float* dout, const float* inp,
            const float* mean, const float* rstd, int N, int C, float* partial) {
  const int chunks = colred_chunks(N);
  const int nout = MODE == 1 ? 2 : 1;
  k_colred_partial<MODE><<<dim3((C + 31) / 32, chunks), dim3(32, 8), 0, st>>>(
      partial, dout, inp, mean, rstd, N, C, chunks);
  LOOM_CUDA_LAUNCHED("column reduction");
  k_colred_finish<<<(C + kThreads - 1) / kThreads, kThreads, 0, st>>>(dst0, dst1, partial, chunks,
                                                                      nout, C);
  LOOM_CUDA_LAUNCHED("column reduction (finish)");
}
}  // namespace

void layernorm_backward(cudaStream_t st, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C, float* partial) {
  if (N <= 0 || C <= 0) return;
  // Parameter gradients first: they read dout, which dinp may overwrite.
  if (dweight || dbias) colred<1>(st, dweight, dbias, dout, inp, mean, rstd, N, C, partial);
  k_layernorm_dinp<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, st>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  LOOM_CUDA_LAUNCHED("layernorm_backward");
}

void rmsnorm_backward(cudaStream_t st, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, int N, int C,
                      float* partial) {
  if (N <= 0 || C <= 0) return;
  if (dweight) colred<2>(st, dweight, nullptr, dout, inp, nullptr, rstd, N, C, partial);
  k_rmsnorm_dinp<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, st>>>(dinp, dout, inp,
                                                                               weight, rstd, N, C);
  LOOM_CUDA_LAUNCHED("rmsnorm_backward");
}

void bias_backward(cudaStream_t st, float* dbias, const float* dout, int N, int C, float* partial) {
  if (N <= 0 || C <= 0 || !dbias) return;
  colred<0>(st, dbias, nullptr, dout, nullptr, nullptr, nullptr, N, C, partial);
}

void embedding_forward(cudaStream_t st, float* out, const int32_t* ids, const float* table, int N,
                       int C, bool accumulate, DeviceError* err) {
  if (int64_t{N} * C <= 0) return;
  k_embedding_fwd<<<grid_1d(int64_t{N} * C), kThreads, 0, st>>>(out, ids, table, N, C, accumulate,
                                                                err);
  LOOM_CUDA_LAUNCHED("embedding_forward");
}

namespace {
size_t cub_sort_bytes(int N) {
  size_t bytes = 0;
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), N));
  return bytes;
}
}  // namespace

size_t embedding_backward_scratch(int N) {
  return 4 * align_n(N) * sizeof(int32_t) + cub_sort_bytes(N) + 256;
}

void embedding_backward(cudaStream_t st, float* dtable, const float* dout, const int32_t* ids,
                        int N, int C, void* scratch, size_t scratch_bytes, DeviceError* err) {
  if (N <= 0 || C <= 0) return;
  LOOM_CHECK(scratch_bytes >= embedding_backward_scratch(N),
             "embedding_backward (cuda): scratch too small");
  int32_t* keys_in = static_cast<int32_t*>(scratch);
  int32_t* keys_out = keys_in + align_n(N);
  int32_t* vals_in = keys_out + align_n(N);
  int32_t* vals_out = vals_in + align_n(N);
  void* temp = vals_out + align_n(N);
  size_t temp_bytes = cub_sort_bytes(N);
  k_embedding_keys<<<grid_1d(N), kThreads, 0, st>>>(keys_in, vals_in, ids, N, err);
  LOOM_CUDA_LAUNCHED("embedding_backward (keys)");
  // Radix sort is stable: rows of one id stay in their original order.
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in,
                                                  vals_out, N, 0, 32, st));
  k_embedding_runs<<<N, 128, 0, st>>>(dtable, dout, keys_out, vals_out, N, C);
  LOOM_CUDA_LAUNCHED("embedding_backward (runs)");
}

void adamw(cudaStream_t st, float* param, const float* grad, float* m, float* v, int64_t n,
           float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
           float c1, float c2) {
  if (n <= 0) return;
  k_adamw<<<grid_1d(n), kThreads, 0, st>>>(param, grad, m, v, n, lr, beta1, beta2, eps,
                                           weight_decay, grad_scale, c1, c2);
  LOOM_CUDA_LAUNCHED("adamw");
}

void adamw_multi(cudaStream_t st, const MtTensor* tensors, const MtChunk* chunks, int nchunks,
                 float lr, float beta1, float beta2, float eps, float grad_scale, float c1,
                 float c2) {
  if (nchunks <= 0) return;
  k_adamw_multi<<<nchunks, kThreads, 0, st>>>(tensors, chunks, lr, beta1, beta2, eps, grad_scale,
                                              c1, c2);
  LOOM_CUDA_LAUNCHED("adamw_multi");
}

void sum_squares(cudaStream_t st, const float* x, int64_t n, double* partial, double* result,
                 bool accumulate_result) {
  const int blocks = sumsq_blocks(n);
  if (n > 0) {
    k_sumsq_partial<<<blocks, kThreads, 0, st>>>(x, n, partial);
    LOOM_CUDA_LAUNCHED("sum_squares");
  } else {
    LOOM_CUDA_CHECK(cudaMemsetAsync(partial, 0, sizeof(double), st));
  }
  k_sumsq_finish<<<1, kThreads, 0, st>>>(partial, n > 0 ? blocks : 1, result, accumulate_result);
  LOOM_CUDA_LAUNCHED("sum_squares (finish)");
}

void weighted_sum(cudaStream_t st, const float* x, const float* w, int64_t n, double* result) {
  k_weighted_sum<<<1, kThreads, 0, st>>>(x, w, n, result);
  LOOM_CUDA_LAUNCHED("weighted_sum");
}

void all_finite(cudaStream_t st, const float* x, int64_t n, int* bad) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), st));
  if (n <= 0) return;
  k_all_finite<<<grid_1d(n, kThreads, 4), kThreads, 0, st>>>(x, n, bad);
  LOOM_CUDA_LAUNCHED("all_finite");
}

}  // namespace loom::cuda
