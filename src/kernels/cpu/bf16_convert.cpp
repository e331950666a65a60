// fp32 <-> bf16 array conversions. The AVX512 path does the rounding in integer arithmetic
// rather than with VCVTNEPS2BF16, because that instruction flushes denormal inputs to zero and
// so would not be bit-identical to f32_to_bf16.

#include "kernels/cpu/bf16_convert.h"

#include <omp.h>

#include <algorithm>

#include "core/dtype.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC 12 reports the deliberately undefined vectors inside its own AVX512 intrinsics
// (_mm512_undefined_epi32) as maybe-uninitialized.
#if !defined(__clang__)  // (clang has no such warning and rejects the name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace loom::cpu {
namespace {

// Parts are multiples of one AVX512 vector (16 floats), so only the last part has a tail.
constexpr size_t kAlign = 16;

#if defined(__x86_64__)
// Round-to-nearest-even of fp32 bit patterns to bf16 (upper 16 bits kept, lower cleared); NaN
// keeps the payload's top bits and gets the quiet bit, like f32_to_bf16. Free functions, not
// lambdas: GCC does not give a lambda its enclosing function's target attribute.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i round_bits_bf16(__m512i u) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf_bits = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  const __m512i round_base = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf_bits);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(round_base, lsb));
  return _mm512_and_si512(_mm512_mask_or_epi32(rounded, nan, u, quiet), high);
}

// The 16 bf16 codes of rounded bit patterns.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m256i bf16_codes(__m512i rounded) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void f32_to_bf16_avx512(const float* src,
                                                                             uint16_t* dst,
                                                                             size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_codes(round_bits_bf16(u)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512i u = _mm512_maskz_loadu_epi32(m, src + i);
    _mm256_mask_storeu_epi16(dst + i, m, bf16_codes(round_bits_bf16(u)));
  }
}

// x[i] = round_bf16(x[i]), and dst[i] = its bits when dst is given: one pass.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void round_bf16_avx512(float* x, uint16_t* dst,
                                                                            size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i r = round_bits_bf16(_mm512_loadu_si512(x + i));
    _mm512_storeu_si512(x + i, r);
    if (dst) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_codes(r));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512i r = round_bits_bf16(_mm512_maskz_loadu_epi32(m, x + i));
    _mm512_mask_storeu_epi32(x + i, m, r);
    if (dst) _mm256_mask_storeu_epi16(dst + i, m, bf16_codes(r));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void bf16_to_f32_avx512(const uint16_t* src,
                                                                             float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
    _mm512_mask_storeu_epi32(dst + i, m, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}
#endif

// One equal part per thread (above the fork/join threshold): the Decoder converts cache-sized
// row blocks of 64K floats, which fixed 64K-element chunks left on one thread (the other
// spinning), and a 3-chunk array split 2:1. Elementwise, so the split never changes a bit.
template <typename Fn>
void chunked(size_t n, Fn&& fn) {
  const int threads =
      worth_parallel(static_cast<int64_t>(n)) && !omp_in_parallel() ? omp_get_max_threads() : 1;
  if (threads <= 1) return fn(size_t{0}, n);
  const size_t part = (n / kAlign + threads - 1) / threads * kAlign;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int t = 0; t < threads; ++t) {
    const size_t begin = std::min(n, static_cast<size_t>(t) * part);
    const size_t end = t + 1 == threads ? n : std::min(n, begin + part);
    if (end > begin) fn(begin, end - begin);
  }
}

}  // namespace

bool bf16_convert_uses_avx512() {
#if defined(__x86_64__)
  return cpu_features().avx512f && cpu_features().avx512bw;
#else
  return false;
#endif
}

void f32_to_bf16_array_portable(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void bf16_to_f32_array_portable(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void f32_to_bf16_array(const float* src, uint16_t* dst, size_t n) {
  const bool avx512 = bf16_convert_uses_avx512();
  chunked(n, [&](size_t begin, size_t count) {
#if defined(__x86_64__)
    if (avx512) return f32_to_bf16_avx512(src + begin, dst + begin, count);
#endif
    (void)avx512;
    f32_to_bf16_array_portable(src + begin, dst + begin, count);
  });
}

void bf16_to_f32_array(const uint16_t* src, float* dst, size_t n) {
  const bool avx512 = bf16_convert_uses_avx512();
  chunked(n, [&](size_t begin, size_t count) {
#if defined(__x86_64__)
    if (avx512) return bf16_to_f32_avx512(src + begin, dst + begin, count);
#endif
    (void)avx512;
    bf16_to_f32_array_portable(src + begin, dst + begin, count);
  });
}

void round_bf16_array_portable(float* x, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(x[i]);
    x[i] = bf16_to_f32(h);
    if (dst) dst[i] = h;
  }
}

void round_bf16_array(float* x, uint16_t* dst, size_t n) {
  const bool avx512 = bf16_convert_uses_avx512();
  chunked(n, [&](size_t begin, size_t count) {
    uint16_t* d = dst ? dst + begin : nullptr;
#if defined(__x86_64__)
    if (avx512) return round_bf16_avx512(x + begin, d, count);
#endif
    (void)avx512;
    round_bf16_array_portable(x + begin, d, count);
  });
}

}  // namespace loom::cpu
