#include "infer/argmax.h"

#include <immintrin.h>

#include <algorithm>

namespace loom::infer {

int argmax_first(const float* x, int n) {
#ifdef __AVX512F__
  constexpr __mmask16 kAll = 0xFFFF;
  if (n >= 64) {
    // The largest value over four chains; any NaN sends the row to std::max_element (whose
    // answer then depends on where the NaN lies, which a max does not reproduce).
    __m512 m[4];
    for (int i = 0; i < 4; ++i) m[i] = _mm512_loadu_ps(x + 16 * i);
    __mmask16 nan = 0;
    for (int i = 0; i < 4; ++i) nan |= _mm512_cmp_ps_mask(m[i], m[i], _CMP_UNORD_Q);
    int j = 64;
    for (; j + 64 <= n; j += 64)
      for (int i = 0; i < 4; ++i) {
        const __m512 v = _mm512_loadu_ps(x + j + 16 * i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m[i] = _mm512_maskz_max_ps(kAll, m[i], v);
      }
    // (Zero-masked forms and a store: GCC 12 warns that the plain ones read an undefined
    // register.)
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_maskz_max_ps(kAll, _mm512_maskz_max_ps(kAll, m[0], m[1]),
                                               _mm512_maskz_max_ps(kAll, m[2], m[3])));
    float best = *std::max_element(lanes, lanes + 16);
    bool tail_nan = false;
    for (int k = j; k < n; ++k) {
      tail_nan |= x[k] != x[k];
      best = std::max(best, x[k]);
    }
    if (nan == 0 && !tail_nan) {
      // The first index holding it (every comparison above was ordered, so one exists).
      const __m512 b = _mm512_set1_ps(best);
      int k = 0;
      for (; k + 16 <= n; k += 16) {
        const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + k), b, _CMP_EQ_OQ);
        if (eq) return k + __builtin_ctz(unsigned(eq));
      }
      for (; k < n; ++k)
        if (x[k] == best) return k;
    }
  }
#endif
  return static_cast<int>(std::max_element(x, x + n) - x);
}

}  // namespace loom::infer
