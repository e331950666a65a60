// Per-tensor fp8 quantisation on the GPU, the arithmetic of the CPU recipes (precision/
// fp8_recipes.cpp, kernels/cpu/fp8.cpp): amax = max |x| compared as bit patterns (a NaN wins,
// as on the CPU), scale = fmt_max / amax / 2^margin (1 when amax is 0 or not finite, fp32's
// max when the quotient overflows), codes = x * scale rounded to nearest even and saturated to
// the format's largest finite value. The scale never leaves the device: the quantise kernel
// derives it from the amax and also writes its inverse, which cuBLASLt reads as the operand's
// scale pointer.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace loom::cuda {
namespace {

__global__ void k_amax(const float* x, int64_t n, unsigned* amax_bits) {
  unsigned m = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, m);  // max is exact: order cannot matter
}

// fmt_max / amax / 2^margin; `prev` when amax is 0 or not finite; fp32's max on overflow.
__device__ float scale_from(float fmt_max, float a, int margin, float prev) {
  if (!(a > 0.f) || !isfinite(a)) return prev;
  const float s = ldexpf(fmt_max / a, -margin);
  return isfinite(s) ? s : FLT_MAX;
}

// The scale a quantisation uses: the stored one (delayed scaling) or one from *amax (current).
__device__ float scale_of(const float* amax, const float* scale, float fmt_max, int margin) {
  return scale != nullptr ? *scale : scale_from(fmt_max, *amax, margin, 1.f);
}

__global__ void k_record_amax(const float* amax, float* pending) {
  if (isfinite(*amax)) *pending = fmaxf(*pending, *amax);
}

// As cpu::fp8_roll_history (the CPU backend's op), one thread.
__global__ void k_roll_history(float* history, int len, int32_t* pos_count, float* pending,
                               const float* amax, float* scale, float fmt_max, int margin,
                               bool most_recent) {
  if (!(*pending >= 0.f)) return;  // nothing recorded since the last step
  const float a = *amax;
  history[pos_count[0]] = a;
  pos_count[0] = (pos_count[0] + 1) % len;
  pos_count[1] = min(pos_count[1] + 1, len);
  float use = a;
  if (!most_recent)
    for (int i = 0; i < len; ++i) use = fmaxf(use, history[i]);
  *scale = scale_from(fmt_max, use, margin, *scale);
  *pending = -1.f;
}

__device__ __nv_fp8_storage_t to_fp8(float v, bool e5m2) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

__global__ void k_quantize(__nv_fp8_storage_t* dst, const float* x, int64_t n, bool e5m2,
                           const float* amax, const float* scale, float fmt_max, int margin,
                           float* scale_inv) {
  const float s = scale_of(amax, scale, fmt_max, margin);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.f / s;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = to_fp8(x[i] * s, e5m2);
}

// dst[c, r] = fp8(x[r, c] * s) through a 32 x 33 shared tile (both sides coalesced).
__global__ void k_quantize_t(__nv_fp8_storage_t* dst, const float* x, int rows, int cols, bool e5m2,
                             const float* amax, const float* scale, float fmt_max, int margin,
                             float* scale_inv) {
  __shared__ float tile[32][33];
  const float s = scale_of(amax, scale, fmt_max, margin);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
    *scale_inv = 1.f / s;
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = x[int64_t{r} * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[int64_t{c} * rows + r] = to_fp8(tile[threadIdx.x][i] * s, e5m2);
  }
}

// ---- MXFP8 (OCP MX v1.0) as kernels/cpu/fp8.cpp's mx_quantize: blocks of 32 elements share an
// E8M0 scale from the block's amax (floor(log2 amax) - the element format's emax, clamped to
// [-127, 127]; 0xFF when the amax is not finite); elements are x * 2^-shared rounded to fp8
// (nearest even, saturating) and written back as bf16 values code * 2^shared (results below
// 2^-126 flushed to signed zero, NaN as 0x7fc0), ready for a bf16 GEMM.
__device__ uint8_t e8m0_scale(unsigned amax_bits, bool e5m2) {
  if (amax_bits >= 0x7f800000u) return 0xFF;
  const int e = amax_bits < 0x00800000u ? -127 : int(amax_bits >> 23) - 127;
  return uint8_t(min(max(e - (e5m2 ? 15 : 8), -127), 127) + 127);
}

__device__ uint16_t mx_element(float x, uint8_t scale, bool e5m2) {
  if (scale == 0xFF) return 0x7fc0;
  const float mult = __uint_as_float(unsigned(254 - scale) << 23);  // 2^(127 - scale)
  const float X =
      scale == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(unsigned(scale) << 23);
  const float v = x * mult;
  if (isnan(v)) return 0x7fc0;
  const __nv_fp8_storage_t c = to_fp8(v, e5m2);
  const __half_raw h = __nv_cvt_fp8_to_halfraw(c, e5m2 ? __NV_E5M2 : __NV_E4M3);
  unsigned d = __float_as_uint(fabsf(__half2float(__half(h))) * X);
  if (d < 0x00800000u) d = 0;
  if (d > 0x7f800000u) return 0x7fc0;
  return uint16_t((d | (__float_as_uint(v) & 0x80000000u)) >> 16);
}

// Blocks along the contiguous columns: one warp per (row, block of 32 columns).
__global__ void k_mx_cols(uint16_t* deq, const float* x, int rows, int cols, bool e5m2) {
  const int nb = (cols + 31) / 32;
  const int64_t w = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= int64_t{rows} * nb) return;
  const int64_t r = w / nb;
  const int c = int(w % nb) * 32 + lane;
  const bool in = c < cols;
  const float v = in ? x[r * cols + c] : 0.f;
  unsigned m = __float_as_uint(v) & 0x7fffffffu;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (in) deq[r * cols + c] = mx_element(v, e8m0_scale(m, e5m2), e5m2);
}

// Blocks of 32 rows: one thread per (block, column), reading down the column twice.
__global__ void k_mx_rows(uint16_t* deq, const float* x, int rows, int cols, bool e5m2) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int nb = (rows + 31) / 32;
  if (i >= int64_t{nb} * cols) return;
  const int b = int(i / cols), c = int(i % cols);
  const int r0 = b * 32, r1 = min(rows, r0 + 32);
  unsigned m = 0;
  for (int r = r0; r < r1; ++r) m = max(m, __float_as_uint(x[int64_t{r} * cols + c]) & 0x7fffffffu);
  const uint8_t s = e8m0_scale(m, e5m2);
  for (int r = r0; r < r1; ++r) {
    const int64_t k = int64_t{r} * cols + c;
    deq[k] = mx_element(x[k], s, e5m2);
  }
}

__global__ void k_set_rows(float* y, const float* b, int rows, int cols) {
  const int64_t n = int64_t{rows} * cols;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = b[i % cols];
}

int blocks_for(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
}

}  // namespace

void fp8_amax(cudaStream_t st, const float* x, int64_t n, float* amax) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), st));
  if (n == 0) return;
  k_amax<<<blocks_for(n), kThreads, 0, st>>>(x, n, reinterpret_cast<unsigned*>(amax));
  LOOM_CUDA_LAUNCHED("fp8_amax");
}

static float fp8_max(bool e5m2) {
  return e5m2 ? 57344.f : 448.f;
}

void fp8_record_amax(cudaStream_t st, const float* amax, float* pending) {
  k_record_amax<<<1, 1, 0, st>>>(amax, pending);
  LOOM_CUDA_LAUNCHED("fp8_record_amax");
}

void fp8_roll_history(cudaStream_t st, float* history, int len, int32_t* pos_count, float* pending,
                      const float* amax, float* scale, bool e5m2, int margin, bool most_recent) {
  k_roll_history<<<1, 1, 0, st>>>(history, len, pos_count, pending, amax, scale, fp8_max(e5m2),
                                  margin, most_recent);
  LOOM_CUDA_LAUNCHED("fp8_roll_history");
}

void fp8_quantize(cudaStream_t st, void* dst, bool e5m2, const float* x, int rows, int cols,
                  bool transpose, const float* amax, const float* scale, int margin,
                  float* scale_inv) {
  const float fmt_max = fp8_max(e5m2);
  auto* d = static_cast<__nv_fp8_storage_t*>(dst);
  if (!transpose) {
    const int64_t n = int64_t{rows} * cols;
    k_quantize<<<blocks_for(std::max<int64_t>(n, 1)), kThreads, 0, st>>>(
        d, x, n, e5m2, amax, scale, fmt_max, margin, scale_inv);
    LOOM_CUDA_LAUNCHED("fp8_quantize");
    return;
  }
  if (rows == 0 || cols == 0) return;
  const dim3 grid((cols + 31) / 32, (rows + 31) / 32);
  k_quantize_t<<<grid, dim3(32, 8), 0, st>>>(d, x, rows, cols, e5m2, amax, scale, fmt_max, margin,
                                             scale_inv);
  LOOM_CUDA_LAUNCHED("fp8_quantize (transposed)");
}

void mx_dequantize(cudaStream_t st, uint16_t* deq, bool e5m2, const float* x, int rows, int cols,
                   bool along_rows) {
  if (rows == 0 || cols == 0) return;
  if (along_rows) {
    const int64_t n = int64_t{(rows + 31) / 32} * cols;
    k_mx_rows<<<grid_1d(n, kThreads, 1, 1 << 30), kThreads, 0, st>>>(deq, x, rows, cols, e5m2);
  } else {
    const int64_t threads = int64_t{rows} * ((cols + 31) / 32) * 32;
    k_mx_cols<<<grid_1d(threads, kThreads, 1, 1 << 30), kThreads, 0, st>>>(deq, x, rows, cols,
                                                                           e5m2);
  }
  LOOM_CUDA_LAUNCHED("mx_dequantize");
}

void set_rows(cudaStream_t st, float* y, const float* b, int rows, int cols) {
  const int64_t n = int64_t{rows} * cols;
  if (n == 0) return;
  k_set_rows<<<blocks_for(n), kThreads, 0, st>>>(y, b, rows, cols);
  LOOM_CUDA_LAUNCHED("set_rows");
}

}  // namespace loom::cuda
