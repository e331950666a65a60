// Sums with a fixed association: 16 interleaved partial sums, combined by a fixed tree. The
// compiler maps the partial sums onto SIMD lanes, yet the result depends only on the values:
// not on pointer alignment (no peeling), thread count, or `omp simd reduction`'s freedom to
// reorder. Determinism of training (bit-identical reruns) rests on this.
#pragma once

#include <cstdint>

namespace loom::cpu {

constexpr int kSumLanes = 16;

// sum_{i < n} term(i), accumulated in Acc (float, or double for long/ill-conditioned sums).
// Element i goes to partial sum i % 16. Terms are first evaluated into a small block with a
// plain elementwise loop (which vectorises even when term has branches, like fast_exp's
// clamps), then added lane by lane.
template <typename Acc, typename Term>
inline Acc ordered_sum(int64_t n, Term term) {
  using T = decltype(term(int64_t{0}));
  constexpr int kBlock = 256;  // a multiple of kSumLanes, so lanes stay i % 16 across blocks
  Acc acc[kSumLanes] = {};
  for (int64_t b = 0; b < n; b += kBlock) {
    const int w = static_cast<int>(n - b < kBlock ? n - b : kBlock);
    T tmp[kBlock];
#pragma omp simd
    for (int j = 0; j < w; ++j) tmp[j] = term(b + j);
    int j = 0;
    for (; j + kSumLanes <= w; j += kSumLanes) {
      for (int l = 0; l < kSumLanes; ++l) acc[l] += static_cast<Acc>(tmp[j + l]);
    }
    for (int l = 0; j + l < w; ++l) acc[l] += static_cast<Acc>(tmp[j + l]);
  }
  for (int w = kSumLanes / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

// max_{i < n} x[i] (-inf for n == 0). Max is exact, so any order gives the same bits.
inline float row_max(const float* x, int64_t n) {
  float m = -__builtin_inff();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace loom::cpu
