#include "kernels/cpu/gemm_lowp.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/fp8.h"

namespace loom::cpu {
namespace {

std::atomic<bool> g_avx512{__builtin_cpu_supports("avx512f") != 0};

// How a weight element becomes fp32 (the scale of int8 is applied to the finished dot product).
inline float widen(uint16_t w) {
  return bf16_to_f32(w);
}
inline float widen(int8_t w) {
  return float(w);
}
inline float widen(float w) {
  return w;
}
// An E4M3 code (never NaN): a normal one's exponent and mantissa bits moved into fp32's place,
// its exponent rebiased by 127 - 7 = 120; a subnormal one (exponent bits 0) is m * 2^-9. Exact,
// and free of fp32 denormals (so the result does not depend on MXCSR's DAZ).
inline float widen(uint8_t w) {
  const float mag = (w & 0x78) != 0
                        ? std::bit_cast<float>(((uint32_t(w) & 0x7F) << 20) + (120u << 23))
                        : float(w & 7) * 0x1p-9f;
  return (w & 0x80) != 0 ? -mag : mag;
}

// Rows [n0, n1) of y for the M inputs, one weight row at a time: y[m, n] = sum_k x[m, k] w[n, k]
// in a fixed order (16 lanes, each summing k = lane, lane + 16, ...; then the lanes pairwise;
// then the tail), the same whatever M or the thread.
template <typename W>
void gemv_rows_scalar(float* y, const float* x, const W* w, const float* scale, const float* b,
                      int M, int K, int N, int n0, int n1) {
  const int K16 = K / 16 * 16;
  for (int n = n0; n < n1; ++n) {
    const W* wr = w + int64_t(n) * K;
    for (int m = 0; m < M; ++m) {
      const float* xr = x + int64_t(m) * K;
      float lane[16] = {};
      for (int k = 0; k < K16; k += 16)
        for (int l = 0; l < 16; ++l) lane[l] = std::fma(widen(wr[k + l]), xr[k + l], lane[l]);
      for (int s = 8; s >= 1; s /= 2)
        for (int l = 0; l < s; ++l) lane[l] += lane[l + s];
      float acc = lane[0];
      for (int k = K16; k < K; ++k) acc = std::fma(widen(wr[k]), xr[k], acc);
      if (scale) acc *= scale[n];
      y[int64_t(m) * N + n] = acc + (b ? b[n] : 0.f);
    }
  }
}

__attribute__((target("avx512f"))) inline __m512 widen16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  // The zero-masked forms: GCC 12 warns that the plain ones read an undefined register.
  const __m512i wide = _mm512_maskz_cvtepu16_epi32(__mmask16(0xFFFF), h);
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xFFFF), wide, 16));
}
__attribute__((target("avx512f"))) inline __m512 widen16(const float* p) {
  return _mm512_loadu_ps(p);
}
__attribute__((target("avx512f"))) inline __m512 widen16(const int8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_maskz_cvtepi32_ps(__mmask16(0xFFFF),
                                  _mm512_maskz_cvtepi8_epi32(__mmask16(0xFFFF), q));
}

__attribute__((target("avx512f"))) inline __m512 widen16(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __mmask16 all = 0xFFFF;
  const __m512i v = _mm512_maskz_cvtepu8_epi32(all, q);
  const __m512i normal = _mm512_add_epi32(
      _mm512_maskz_slli_epi32(all, _mm512_and_si512(v, _mm512_set1_epi32(0x7F)), 20),
      _mm512_set1_epi32(120 << 23));
  const __m512 sub =
      _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(all, _mm512_and_si512(v, _mm512_set1_epi32(7))),
                    _mm512_set1_ps(0x1p-9f));
  const __mmask16 is_normal = _mm512_test_epi32_mask(v, _mm512_set1_epi32(0x78));
  const __m512 mag = _mm512_mask_blend_ps(is_normal, sub, _mm512_castsi512_ps(normal));
  const __m512i sign =
      _mm512_maskz_slli_epi32(all, _mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag), sign));
}

// The same sums as gemv_rows_scalar, 16 lanes in a register; up to 8 inputs share each widened
// weight vector (a weight row of a few KB stays in L1 for the next 8).
template <typename W>
__attribute__((target("avx512f"))) void gemv_rows_avx512(float* y, const float* x, const W* w,
                                                         const float* scale, const float* b, int M,
                                                         int K, int N, int n0, int n1) {
  const int K16 = K / 16 * 16;
  for (int n = n0; n < n1; ++n) {
    const W* wr = w + int64_t(n) * K;
    if (n + 1 < n1) _mm_prefetch(reinterpret_cast<const char*>(wr + K), _MM_HINT_T0);
    for (int m0 = 0; m0 < M; m0 += 8) {
      const int mt = std::min(8, M - m0);
      __m512 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
      for (int k = 0; k < K16; k += 16) {
        const __m512 wv = widen16(wr + k);
        for (int i = 0; i < mt; ++i)
          acc[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + int64_t(m0 + i) * K + k), acc[i]);
      }
      for (int i = 0; i < mt; ++i) {
        // Lanes reduced pairwise exactly as the scalar loop does (l += l + 8, + 4, + 2, + 1).
        alignas(64) float lane[16];
        _mm512_store_ps(lane, acc[i]);
        for (int s = 8; s >= 1; s /= 2)
          for (int l = 0; l < s; ++l) lane[l] += lane[l + s];
        float a = lane[0];
        const float* xr = x + int64_t(m0 + i) * K;
        for (int k = K16; k < K; ++k) a = std::fma(widen(wr[k]), xr[k], a);
        if (scale) a *= scale[n];
        y[int64_t(m0 + i) * N + n] = a + (b ? b[n] : 0.f);
      }
    }
  }
}

template <typename W>
void gemv(float* y, const float* x, const W* w, const float* scale, const float* b, int M, int K,
          int N) {
  const bool avx = g_avx512.load(std::memory_order_relaxed);
  // Contiguous row ranges per thread: each streams its own part of W once.
  const bool par = int64_t(N) * K >= (int64_t(1) << 16);
#pragma omp parallel if (par)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int n0 = int(int64_t(N) * t / nt), n1 = int(int64_t(N) * (t + 1) / nt);
    if (avx)
      gemv_rows_avx512(y, x, w, scale, b, M, K, N, n0, n1);
    else
      gemv_rows_scalar(y, x, w, scale, b, M, K, N, n0, n1);
  }
}

// Large M: blocks of rows of W widened to fp32 (scale folded in), then one BLAS GEMM per block.
template <typename W>
void gemm_blocked(float* y, const float* x, const W* w, const float* scale, const float* b, int M,
                  int K, int N) {
  const int rows = std::max(16, std::min(N, int((int64_t(4) << 20) / (int64_t(K) * 4))));
  std::vector<float> wf(size_t(rows) * K);
  for (int n0 = 0; n0 < N; n0 += rows) {
    const int nb = std::min(rows, N - n0);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < nb; ++r) {
      const W* src = w + int64_t(n0 + r) * K;
      float* dst = wf.data() + int64_t(r) * K;
      const float s = scale ? scale[n0 + r] : 1.f;
      for (int k = 0; k < K; ++k) dst[k] = widen(src[k]) * s;
    }
    blas_sgemm(false, true, M, nb, K, 1.f, x, K, wf.data(), K, 0.f, y + n0, N);
  }
  if (b)
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) y[int64_t(m) * N + n] += b[n];
}

}  // namespace

void linear_bf16w(float* y, const float* x, const uint16_t* w, const float* b, int M, int K,
                  int N) {
  if (M <= kLowpGemvRows)
    gemv(y, x, w, nullptr, b, M, K, N);
  else
    gemm_blocked(y, x, w, nullptr, b, M, K, N);
}

void linear_int8w(float* y, const float* x, const int8_t* w, const float* scale, const float* b,
                  int M, int K, int N) {
  if (M <= kLowpGemvRows)
    gemv(y, x, w, scale, b, M, K, N);
  else
    gemm_blocked(y, x, w, scale, b, M, K, N);
}

void linear_fp8w(float* y, const float* x, const uint8_t* w, const float* scale, const float* b,
                 int M, int K, int N) {
  if (M <= kLowpGemvRows)
    gemv(y, x, w, scale, b, M, K, N);
  else
    gemm_blocked(y, x, w, scale, b, M, K, N);
}

void gemv_f32w(float* y, const float* x, const float* w, const float* b, int M, int K, int N) {
  gemv(y, x, w, nullptr, b, M, K, N);
}

void row_amax(const float* w, int N, int K, float* amax) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float mx = fp8_amax(w + int64_t(n) * K, K);  // NaN when the row holds one
    amax[n] = std::isfinite(mx) ? mx : INFINITY;
  }
}

bool quantize_int8_rows(const float* w, int N, int K, int8_t* q, float* scale, const float* amax) {
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (int n = 0; n < N; ++n) {
    const float* r = w + int64_t(n) * K;
    const float own = fp8_amax(r, K);
    const float mx = amax ? std::max(amax[n], own) : own;
    if (!std::isfinite(mx) || !std::isfinite(own)) {
      finite = false;
      continue;
    }
    const float s = mx > 0 ? mx / 127.f : 1.f;
    scale[n] = s;
    for (int k = 0; k < K; ++k)
      q[int64_t(n) * K + k] = int8_t(std::clamp(std::round(r[k] / s), -127.f, 127.f));
  }
  return finite;
}

bool quantize_fp8_rows(const float* w, int N, int K, uint8_t* q, float* scale, const float* amax) {
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (int n = 0; n < N; ++n) {
    const float* r = w + int64_t(n) * K;
    const float own = fp8_amax(r, K);
    const float mx = amax ? std::max(amax[n], own) : own;
    if (!std::isfinite(mx) || !std::isfinite(own)) {
      finite = false;
      continue;
    }
    // A row of denormals would overflow 448 / max: clamped, as the training recipes' scales.
    const float qs = mx > 0 ? std::min(448.f / mx, FLT_MAX) : 1.f;
    scale[n] = 1.f / qs;
    fp8_quantize(Fp8Format::E4M3, r, qs, q + int64_t(n) * K, K);
  }
  return finite;
}

bool lowp_uses_avx512() {
  return g_avx512.load();
}

void set_lowp_avx512(bool on) {
  g_avx512 = on && __builtin_cpu_supports("avx512f");
}

}  // namespace loom::cpu
