#include "kernels/cpu/gemm_lowp.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm_lowp_amx.h"
#include "kernels/cpu/lane_sums.h"

namespace loom::cpu {
namespace {

// AVX512F and BW (fp8's widening works on 16-bit lanes; every AVX-512 CPU since Skylake-X has
// both).
bool cpu_has_avx512() {
  return cpu_features().avx512f && cpu_features().avx512bw;
}
std::atomic<bool> g_avx512{cpu_has_avx512()};
// AVX512_VBMI (byte permutes): fp8's single-input GEMV widens its codes by table look-ups.
bool cpu_has_vbmi() {
  return cpu_has_avx512() && cpu_features().avx512vbmi;
}
// Where the permutes are the faster widening: on AMD's Zen 4 they were (43 against 37 G weights/s
// per thread in cache); on Intel's cores with AVX512_FP16 (and AMX), whose fp16 conversion is
// cheaper, the AVX512BW steps are (18.7 against 17.5, docs/serving.md "AMX machine").
bool prefer_vbmi() {
  return cpu_has_vbmi() && !cpu_features().avx512fp16;
}
std::atomic<bool> g_vbmi{prefer_vbmi()};

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

// The GEMV sums fp8 weights at 2^-8 times their value (what the fp16 converter gives, see
// widen16_gemv) and multiplies the lanes' sum back: one multiply per 16 weights fewer, the same
// bits (scaling every term by a power of two scales every rounding alike).
template <typename W>
constexpr float kGemvUnscale = 1.f;
template <>
constexpr float kGemvUnscale<uint8_t> = 256.f;

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
        for (int l = 0; l < 16; ++l)
          lane[l] = std::fma(widen(wr[k + l]) * (1.f / kGemvUnscale<W>), xr[k + l], lane[l]);
      for (int s = 8; s >= 1; s /= 2)
        for (int l = 0; l < s; ++l) lane[l] += lane[l + s];
      float acc = lane[0] * kGemvUnscale<W>;
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

// An E4M3 code is an fp16 number with the top exponent bit zero, the exponent rebiased from 7 to
// 15 (so its value is 2^-8 times the code's): sign to bit 15, exponent and mantissa to bits
// 13..7. Sign-extending the byte to 16 bits and shifting it left by 7 puts them there, with the
// sign in bit 14 too, which the mask clears; the hardware's fp16 -> fp32 conversion is exact
// (subnormal codes included), and the product with 2^8 is exact too.
__attribute__((target("avx512f"))) inline __m512 widen16(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(q), 7),
                                     _mm256_set1_epi16(int16_t(0xBFFF)));
  return _mm512_mul_ps(_mm512_maskz_cvtph_ps(__mmask16(0xFFFF), h), _mm512_set1_ps(256.f));
}

// What the GEMV multiplies: the widened weights, divided by kGemvUnscale<W> (fp8: the fp16
// conversion alone).
template <typename W>
__attribute__((target("avx512f"))) inline __m512 widen16_gemv(const W* p) {
  return widen16(p);
}
template <>
__attribute__((target("avx512f"))) inline __m512 widen16_gemv(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(q), 7),
                                     _mm256_set1_epi16(int16_t(0xBFFF)));
  return _mm512_maskz_cvtph_ps(__mmask16(0xFFFF), h);
}

// fp8 codes 32 at a time: widen16_gemv's three integer steps once on all 32 (as words in one
// 512-bit register), then the two fp16 halves converted: 6 instructions per 32 weights where
// two widen16_gemv take 8 (fp8's GEMV is bound by them, not by the read, at one thread).
// lo = codes p[0, 16), hi = p[16, 32), the values widen16_gemv gives.
__attribute__((target("avx512f,avx512bw"))) inline void widen32_gemv(const uint8_t* p, __m512& lo,
                                                                     __m512& hi) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(q), 7),
                                     _mm512_set1_epi16(int16_t(0xBFFF)));
  lo = _mm512_maskz_cvtph_ps(__mmask16(0xFFFF),
                             _mm512_maskz_extracti64x4_epi64(__mmask8(0xFF), h, 0));
  hi = _mm512_maskz_cvtph_ps(__mmask16(0xFFFF),
                             _mm512_maskz_extracti64x4_epi64(__mmask8(0xFF), h, 1));
}
// Whether a weight type widens 32 at a time (the others: 16, as their widening gains nothing).
template <typename W>
constexpr bool kWiden32 = false;
template <>
constexpr bool kWiden32<uint8_t> = true;

// The lanes of v summed exactly as the scalar loop sums them: lane l += lane l + 8 (l < 8), then
// + 4, + 2, + 1; lane 0 is the result.
__attribute__((target("avx512f"))) inline float reduce_lanes(__m512 v) {
  // In full registers with the zero-masked shuffles (GCC 12 warns that the plain ones and the
  // 256-bit extracts read an undefined register); only the low lanes of each sum matter.
  const __mmask16 all = 0xFFFF;
  const __m512 a = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, 0xEE));  // + 8
  const __m512 b = _mm512_add_ps(a, _mm512_maskz_shuffle_f32x4(all, a, a, 0x55));  // + 4
  const __m512 c = _mm512_add_ps(b, _mm512_maskz_permute_ps(all, b, 0x4E));        // + 2
  const __m512 d = _mm512_add_ps(c, _mm512_maskz_permute_ps(all, c, 0xB1));        // + 1
  return _mm512_cvtss_f32(d);
}

// R weight rows from row n times MB inputs from input m0: R * MB accumulators, each summing
// its row and input in gemv_rows_scalar's order (so the bits are the same), all advancing
// together: each widened weight vector serves MB inputs, each input vector R rows, and the R *
// MB independent chains hide the FMA's latency (one chain, as M = 1 with a row at a time, is
// bound by it: 16 weights per FMA latency, under the read bandwidth for 1- and 2-byte
// weights).
template <typename W, int R, int MB>
__attribute__((target("avx512f,avx512bw"))) inline void gemv_tile_avx512(
    float* y, const float* x, const W* w, const float* scale, const float* b, int K, int N, int n,
    int m0, bool prefetch) {
  const int K16 = K / 16 * 16;
  // The next R rows (contiguous after these) are fetched while these are summed, as much of
  // them per step as the step reads of these: the hardware prefetcher alone does not follow R
  // streams that each advance 16 bytes a step (int8) closely enough.
  constexpr int kStepLines = std::max(1, R * 16 * int(sizeof(W)) / 64);
  // (As an integer: past the matrix's last rows the address is only a hint, never a pointer.)
  const uintptr_t next = reinterpret_cast<uintptr_t>(w + int64_t(n) * K) + R * K * sizeof(W);
  const W* wr[R];
  const float* xr[MB];
  for (int r = 0; r < R; ++r) wr[r] = w + int64_t(n + r) * K;
  for (int i = 0; i < MB; ++i) xr[i] = x + int64_t(m0 + i) * K;
  __m512 acc[R][MB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm512_setzero_ps();
  int k = 0;
  // (Single inputs only: with 4 inputs the extra x registers cost more than the widening saves,
  // 40 against 52 GMAC/s.)
  if constexpr (kWiden32<W> && MB == 1) {
    // Two of the steps below at once, in the same order (lane l still sums k = l, l + 16, ...).
    for (; k + 32 <= K16; k += 32) {
      if (prefetch)
        for (int j = 0; j < 2 * kStepLines; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(next + uintptr_t(k) * R * sizeof(W) + 64 * j),
                       _MM_HINT_T0);
      __m512 xlo[MB], xhi[MB];
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        xlo[i] = _mm512_loadu_ps(xr[i] + k);
        xhi[i] = _mm512_loadu_ps(xr[i] + k + 16);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m512 lo, hi;
        widen32_gemv(wr[r] + k, lo, hi);
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i)
          acc[r][i] = _mm512_fmadd_ps(hi, xhi[i], _mm512_fmadd_ps(lo, xlo[i], acc[r][i]));
      }
    }
  }
  for (; k < K16; k += 16) {
    if (prefetch)
      for (int j = 0; j < kStepLines; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(next + uintptr_t(k) * R * sizeof(W) + 64 * j),
                     _MM_HINT_T0);
    __m512 xv[MB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) xv[i] = _mm512_loadu_ps(xr[i] + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 wv = widen16_gemv(wr[r] + k);
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i) {
      float a = reduce_lanes(acc[r][i]) * kGemvUnscale<W>;
      for (int k = K16; k < K; ++k) a = std::fma(widen(wr[r][k]), xr[i][k], a);
      if (scale) a *= scale[n + r];
      y[int64_t(m0 + i) * N + n + r] = a + (b ? b[n + r] : 0.f);
    }
}

// fp8 by byte permutes (AVX512_VBMI), 64 codes at a time, for a single input: fp8's GEMV is
// bound by its widening (widen32_gemv: sign extension, shift, mask, an extract and two fp16
// conversions per 32 codes), not by the read. Every E4M3 value times 2^-8 (what widen16_gemv
// gives) is exact in bf16, whose bits are the top half of the fp32's: one `vpermi2b` per byte
// looks up a code's low and high byte of those bits (the index's bit 7, the sign, is ignored by
// it and OR-ed into the high byte after), one `vpermt2b` per 32 codes interleaves them into
// words, and each word vector gives two fp32 vectors by a shift (even words) and a mask (odd
// words). The interleave puts code j and code 16 + j in words 2j and 2j + 1, so lane j of the
// four fp32 vectors holds codes j, 16 + j, 32 + j, 48 + j: the lanes sum the same weights in
// the same order as the 16- and 32-wide steps (the same bits). 9 instructions per 64 codes
// where widen32_gemv takes 12. The NaN codes (0x7F, 0xFF; quantize_fp8_rows saturates at 448,
// 0x7E, and never writes them) decode as widen16_gemv decodes them, to +-480 * 2^-8.
struct Fp8Tables {
  alignas(64) uint8_t lo[128], hi[128];  // bytes 0 and 1 of bf16(|code| value * 2^-8)
  alignas(64) uint8_t mix[2][64];        // vpermt2b indices: words (lo, hi) of codes j, 16 + j
  Fp8Tables() {
    for (int c = 0; c < 128; ++c) {
      // The fp16 reading of widen16_gemv, in scalar form: exact in fp32 and in bf16.
      const float v = widen(uint8_t(c)) * 0x1p-8f;
      const uint32_t bits = std::bit_cast<uint32_t>(v);
      lo[c] = uint8_t(bits >> 16);
      hi[c] = uint8_t(bits >> 24);
    }
    for (int half = 0; half < 2; ++half)
      for (int q = 0; q < 64; ++q) {
        const int word = q / 2, code = 32 * half + (word % 2) * 16 + word / 2;
        mix[half][q] = uint8_t(code + (q % 2) * 64);  // odd bytes from the second table (hi)
      }
  }
};
const Fp8Tables& fp8_tables() {
  static const Fp8Tables t;
  return t;
}

template <int R>
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void gemv_tile_fp8_vbmi(
    float* y, const float* x, const uint8_t* w, const float* scale, const float* b, int K, int N,
    int n, bool prefetch) {
  const int K16 = K / 16 * 16;
  constexpr int kStepLines = R;  // 64 bytes of each row per step: R lines of the next R rows
  const uintptr_t next = reinterpret_cast<uintptr_t>(w + int64_t(n) * K) + uintptr_t(R) * K;
  const Fp8Tables& t = fp8_tables();
  const __m512i lo0 = _mm512_load_si512(t.lo), lo1 = _mm512_load_si512(t.lo + 64);
  const __m512i hi0 = _mm512_load_si512(t.hi), hi1 = _mm512_load_si512(t.hi + 64);
  const __m512i mix0 = _mm512_load_si512(t.mix[0]), mix1 = _mm512_load_si512(t.mix[1]);
  const __m512i sign = _mm512_set1_epi8(int8_t(0x80));
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  const uint8_t* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = w + int64_t(n + r) * K;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 64 <= K16; k += 64) {
    if (prefetch)
      for (int j = 0; j < kStepLines; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(next + uintptr_t(k) * R + 64 * j), _MM_HINT_T0);
    const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
    const __m512 x2 = _mm512_loadu_ps(x + k + 32), x3 = _mm512_loadu_ps(x + k + 48);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i c = _mm512_loadu_si512(wr[r] + k);
      const __m512i l = _mm512_permutex2var_epi8(lo0, c, lo1);
      // hi | (c & sign): the table's high byte with the code's sign bit.
      const __m512i h =
          _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, c, hi1), c, sign, 0xF8);
      const __m512i w0 = _mm512_permutex2var_epi8(l, mix0, h);  // words of codes 0..31
      const __m512i w1 = _mm512_permutex2var_epi8(l, mix1, h);  // codes 32..63
      __m512 a = acc[r];
      a = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xFFFF), w0, 16)),
                          x0, a);
      a = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w0, high)), x1, a);
      a = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xFFFF), w1, 16)),
                          x2, a);
      acc[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w1, high)), x3, a);
    }
  }
  // The rest as the 32- and 16-wide steps take it (the same order).
  for (; k + 32 <= K16; k += 32) {
    const __m512 xlo = _mm512_loadu_ps(x + k), xhi = _mm512_loadu_ps(x + k + 16);
    for (int r = 0; r < R; ++r) {
      __m512 lo, hi;
      widen32_gemv(wr[r] + k, lo, hi);
      acc[r] = _mm512_fmadd_ps(hi, xhi, _mm512_fmadd_ps(lo, xlo, acc[r]));
    }
  }
  for (; k < K16; k += 16) {
    const __m512 xv = _mm512_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(widen16_gemv(wr[r] + k), xv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float a = reduce_lanes(acc[r]) * kGemvUnscale<uint8_t>;
    for (int kk = K16; kk < K; ++kk) a = std::fma(widen(wr[r][kk]), x[kk], a);
    if (scale) a *= scale[n + r];
    y[n + r] = a + (b ? b[n + r] : 0.f);
  }
}

// Rows per tile of a single input (gemv_tile_avx512 with MB = 1): 8 for 1-byte weights (8
// chains), 4 for bf16 and fp32. With 8 rows of wider weights the tile and the next one it
// prefetches were 24 KB (bf16) and 48 KB (fp32) at K = 768, against int8's 12 KB, whose GEMV
// reads at the probe: near or past Zen 4's 32 KB L1, so prefetched lines were evicted before
// use. 4 rows made the sum of every layer's best call 3-5% faster for bf16 and up to ~10% for
// fp32 (slow memory state; none for fp32 in the fast one), measured alternating with 8 rows
// (docs/serving.md, s27-decode). 4 chains still hide the FMA latency: 2- and 4-byte weights
// are read-bound well before the FMA port is.
template <typename W>
constexpr int kSingleInputRows = sizeof(W) == 1 ? 8 : 4;

// Inputs in blocks of up to 4 (16 accumulators for 4 rows: 21 of the 32 vector registers with
// the inputs and the weight); a single input takes kSingleInputRows rows at a time.
template <typename W, int R>
__attribute__((target("avx512f,avx512bw"))) void gemv_rowblock_avx512(float* y, const float* x,
                                                                      const W* w,
                                                                      const float* scale,
                                                                      const float* b, int M, int K,
                                                                      int N, int n, bool more) {
  int m0 = 0;
  // The block's weights come from memory for the first inputs only (then from the caches); the
  // next rows are fetched only where this thread reads them next (`more`).
  for (; m0 + 4 <= M; m0 += 4)
    gemv_tile_avx512<W, R, 4>(y, x, w, scale, b, K, N, n, m0, m0 == 0 && more);
  switch (M - m0) {
    case 3:
      gemv_tile_avx512<W, R, 3>(y, x, w, scale, b, K, N, n, m0, m0 == 0 && more);
      break;
    case 2:
      gemv_tile_avx512<W, R, 2>(y, x, w, scale, b, K, N, n, m0, m0 == 0 && more);
      break;
    case 1:
      gemv_tile_avx512<W, R, 1>(y, x, w, scale, b, K, N, n, m0, m0 == 0 && more);
      break;
  }
}

// fp32 weights, batches of kF32BatchMinRows inputs or more: the 4 x 4 tile above is bound by
// its loads (a weight or input vector per two FMAs, the reductions one lane tree per output).
// This block takes kF32BatchRows rows and the inputs 3 at a time: 24 accumulators, 11 loads per
// 24 FMAs; the accumulators of every input are kept (`part`) and each row's 16 reduced at once
// (sum_lanes16). Each output sums in gemv_rows_scalar's order (lane l: k = l, l + 16, ... in
// turn; then the lanes as reduce_lanes adds them; then the tail): the same bits as the other
// tiles, so a row's result does not depend on the batch. The next block's rows are fetched into
// L2 a few lines per step of every input (fetching them into L1 during the first input's pass
// only, as the other tiles do, left 25% between M = 16 from memory and from the caches).
// Measured against the 4 x 4 tile in docs/serving.md (AMX machine, s29): in the caches at one
// thread M = 16 2.45 against 3.10 ms, M = 6 1.23 against 1.34; M = 4 and below slower.
constexpr int kF32BatchRows = 8;
constexpr int kF32BatchMinRows = 6;

// The next rows' lines, fetched a few per step of every input block: `per_step` lines from `at`
// until `end`.
struct LinePrefetch {
  uintptr_t at = 0, end = 0;
  int per_step = 0;
  __attribute__((target("avx512f"))) void step() {
    for (int j = 0; j < per_step && at < end; ++j, at += 64)
      _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T1);
  }
};

template <int MB>
__attribute__((target("avx512f"))) inline void f32_batch_tile(__m512* part, const float* x,
                                                              const float* w, int K, int m0,
                                                              LinePrefetch& pf) {
  constexpr int R = kF32BatchRows;
  __m512 acc[R][MB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int k = 0; k + 16 <= K; k += 16) {
    pf.step();
    __m512 xv[MB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) xv[i] = _mm512_loadu_ps(x + int64_t(m0 + i) * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 wv = _mm512_loadu_ps(w + int64_t(r) * K + k);
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) part[r * kLowpGemvRows + m0 + i] = acc[r][i];
}

// Inputs 3 at a time (a last 4 as 2 + 2): how many the next block takes of `left`.
inline int f32_block_inputs(int left) {
  return left == 3 || left >= 5 ? 3 : left == 1 ? 1 : 2;
}

// Rows [n, n + kF32BatchRows) of y for M <= kLowpGemvRows inputs.
__attribute__((target("avx512f"))) void f32_batch_rowblock(float* y, const float* x, const float* w,
                                                           const float* b, int M, int K, int N,
                                                           int n, bool more) {
  if (M > kLowpGemvRows) {  // (gemv_f32w serves any M) in groups of kLowpGemvRows inputs
    for (int m0 = 0; m0 < M; m0 += kLowpGemvRows)
      f32_batch_rowblock(y + int64_t(m0) * N, x + int64_t(m0) * K, w, b,
                         std::min(kLowpGemvRows, M - m0), K, N, n, more && m0 == 0);
    return;
  }
  constexpr int R = kF32BatchRows;
  const int K16 = K / 16 * 16;
  const float* wb = w + int64_t(n) * K;
  int passes = 0;  // over the rows, one per block of inputs
  for (int m0 = 0; m0 < M; m0 += f32_block_inputs(M - m0)) ++passes;
  const int steps = std::max(1, passes * (K16 / 16)), lines = R * K * 4 / 64;
  LinePrefetch pf;
  pf.at = reinterpret_cast<uintptr_t>(wb) + uintptr_t(R) * K * 4;
  pf.end = more ? pf.at + uintptr_t(lines) * 64 : pf.at;
  pf.per_step = (lines + steps - 1) / steps;
  __m512 part[R * kLowpGemvRows];  // [row][input]; absent inputs' slots zero
  for (int i = M; i < kLowpGemvRows; ++i)
    for (int r = 0; r < R; ++r) part[r * kLowpGemvRows + i] = _mm512_setzero_ps();
  for (int m0 = 0, mb = 0; m0 < M; m0 += mb) {
    mb = f32_block_inputs(M - m0);
    if (mb == 3)
      f32_batch_tile<3>(part, x, wb, K, m0, pf);
    else if (mb == 2)
      f32_batch_tile<2>(part, x, wb, K, m0, pf);
    else
      f32_batch_tile<1>(part, x, wb, K, m0, pf);
  }
  // Each row's 16 sums at once (sum_lanes16: reduce_lanes's additions, the same bits; the
  // slots of absent inputs hold zeros).
  for (int r = 0; r < R; ++r) {
    alignas(64) float sums[kLowpGemvRows];
    _mm512_store_ps(sums, sum_lanes16(part + r * kLowpGemvRows));
    for (int m = 0; m < M; ++m) {
      float a = sums[m];
      for (int k = K16; k < K; ++k) a = std::fma(wb[int64_t(r) * K + k], x[int64_t(m) * K + k], a);
      y[int64_t(m) * N + n + r] = a + (b ? b[n + r] : 0.f);
    }
  }
}

template <typename W>
__attribute__((target("avx512f,avx512bw"))) void gemv_rows_avx512(float* y, const float* x,
                                                                  const W* w, const float* scale,
                                                                  const float* b, int M, int K,
                                                                  int N, int n0, int n1) {
  int n = n0;
  // A tile prefetches the rows after it where this thread reads them next, or past the
  // matrix's end (where the weights' single allocation usually holds the next layer's, whose
  // first rows the first thread reads next): not the next thread's first rows, which it has
  // read already (a tile of wasted reads per thread and call, 2% of a 768-row layer's half at
  // 2 threads).
  const auto more = [&](int next) { return next < n1 || n1 == N; };
  if constexpr (std::is_same_v<W, uint8_t>)
    if (M == 1 && g_vbmi.load(std::memory_order_relaxed))
      for (; n + 8 <= n1; n += 8) gemv_tile_fp8_vbmi<8>(y, x, w, scale, b, K, N, n, more(n + 8));
  if constexpr (std::is_same_v<W, float>)
    if (M >= kF32BatchMinRows)
      for (; n + kF32BatchRows <= n1; n += kF32BatchRows)
        f32_batch_rowblock(y, x, w, b, M, K, N, n, more(n + kF32BatchRows));
  constexpr int R1 = kSingleInputRows<W>;
  if (M == 1)
    for (; n + R1 <= n1; n += R1)
      gemv_tile_avx512<W, R1, 1>(y, x, w, scale, b, K, N, n, 0, more(n + R1));
  for (; n + 4 <= n1; n += 4)
    gemv_rowblock_avx512<W, 4>(y, x, w, scale, b, M, K, N, n, more(n + 4));
  for (; n < n1; ++n) gemv_rowblock_avx512<W, 1>(y, x, w, scale, b, M, K, N, n, more(n + 1));
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

// dst[k] = widen(src[k]) * s: 16 at a time in registers (the same bits as the scalar loop).
template <typename W>
__attribute__((target("avx512f"))) void widen_row_avx512(float* dst, const W* src, int K, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  int k = 0;
  for (; k + 16 <= K; k += 16) _mm512_storeu_ps(dst + k, _mm512_mul_ps(widen16(src + k), sv));
  for (; k < K; ++k) dst[k] = widen(src[k]) * s;
}

// Large M: blocks of rows of W widened to fp32 (scale folded in), then one BLAS GEMM per block.
template <typename W>
void gemm_blocked(float* y, const float* x, const W* w, const float* scale, const float* b, int M,
                  int K, int N) {
  const bool avx = g_avx512.load(std::memory_order_relaxed);
  const int rows = std::max(16, std::min(N, int((int64_t(4) << 20) / (int64_t(K) * 4))));
  std::vector<float> wf(size_t(rows) * K);
  for (int n0 = 0; n0 < N; n0 += rows) {
    const int nb = std::min(rows, N - n0);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < nb; ++r) {
      const W* src = w + int64_t(n0 + r) * K;
      float* dst = wf.data() + int64_t(r) * K;
      const float s = scale ? scale[n0 + r] : 1.f;
      if (avx)
        widen_row_avx512(dst, src, K, s);
      else
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
  if (amx_linear_bf16w(y, x, w, b, M, K, N)) return;
  if (M <= kLowpGemvRows)
    gemv(y, x, w, nullptr, b, M, K, N);
  else
    gemm_blocked(y, x, w, nullptr, b, M, K, N);
}

void linear_int8w(float* y, const float* x, const int8_t* w, const float* scale, const float* b,
                  int M, int K, int N) {
  if (amx_linear_int8w(y, x, w, scale, b, M, K, N)) return;
  if (M <= kLowpGemvRows)
    gemv(y, x, w, scale, b, M, K, N);
  else
    gemm_blocked(y, x, w, scale, b, M, K, N);
}

void linear_fp8w(float* y, const float* x, const uint8_t* w, const float* scale, const float* b,
                 int M, int K, int N) {
  if (amx_linear_fp8w(y, x, w, scale, b, M, K, N)) return;
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
  g_avx512 = on && cpu_has_avx512();
}

bool lowp_uses_vbmi() {
  return g_vbmi.load();
}

void set_lowp_vbmi(bool on) {
  g_vbmi = on && cpu_has_vbmi();
}

}  // namespace loom::cpu
