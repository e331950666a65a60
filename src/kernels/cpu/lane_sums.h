// Sums of the 16 lanes of AVX-512 vectors, 16 vectors at once (the paged decode's scores, the
// fp32 GEMV's outputs for a batch).
#pragma once

#include <immintrin.h>

namespace loom::cpu {

// r[j] = the sum of v[j]'s 16 lanes, for 16 vectors at once: halving steps that add two
// vectors' halves side by side (31 shuffles and 15 adds), where one lane tree per vector takes
// 4 shuffles and 4 adds each. Each sum is the tree lane l += lane l + 8 (l < 8), then + 4, + 2,
// + 1, with the lower lane always the first operand: the same additions, so the same bits, as a
// vector's own tree in that order. (Zero-masked forms: GCC 12 warns that the plain ones read an
// undefined register.)
__attribute__((target("avx512f"))) inline __m512 sum_lanes16(const __m512* v) {
  constexpr __mmask16 kAll = 0xFFFF;
  __m512 u[8], w[4], x[2];
  for (int i = 0; i < 8; ++i)  // each 256-bit half: one vector's 8 partial sums
    u[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAll, v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_maskz_shuffle_f32x4(kAll, v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit lane k of w[i]: 4 partial sums of v[4i + k]
    w[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAll, u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_maskz_shuffle_f32x4(kAll, u[2 * i], u[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    x[i] = _mm512_add_ps(_mm512_maskz_shuffle_ps(kAll, w[2 * i], w[2 * i + 1], 0x44),
                         _mm512_maskz_shuffle_ps(kAll, w[2 * i], w[2 * i + 1], 0xEE));
  // Element e of 128-bit lane k now holds v[4e + k]'s sum: put it at lane 4e + k.
  const __m512 y = _mm512_add_ps(_mm512_maskz_shuffle_ps(kAll, x[0], x[1], 0x88),
                                 _mm512_maskz_shuffle_ps(kAll, x[0], x[1], 0xDD));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_maskz_permutexvar_ps(kAll, idx, y);
}

}  // namespace loom::cpu
