// Causal attention with a sliding window and/or soft-capped scores (Gemma 2 and 3), one
// (sequence, head) at a time over a row of scores: exact, in a fixed summation order (the bits
// do not depend on the thread count), but O(len^2) per head with no tiling, so slower than
// attention.cpp's tiled kernel, which the model keeps for layers without these options.
//
// Score of query i and key j of one sequence: z = scale * q_i . k_j, capped to
// softcap * tanh(z / softcap) when softcap > 0; key j is seen when j <= i and, with a window W,
// i - j < W (the last W positions, the query's own included).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"

namespace loom::cpu {
namespace {

inline float dot(const float* a, const float* b, int D) {
  float s = 0;
  for (int d = 0; d < D; ++d) s = std::fma(a[d], b[d], s);
  return s;
}

inline float cap_score(float z, float softcap) {
  return softcap > 0 ? softcap * std::tanh(z / softcap) : z;
}

void check_args(const int32_t* cu, int nseq, int Hq, int Hkv, int D, int ld, int window,
                float softcap, const char* op) {
  LOOM_CHECK(Hq > 0 && Hkv > 0 && D > 0 && Hq % Hkv == 0, op, ": bad heads Hq=", Hq, " Hkv=", Hkv,
             " D=", D);
  LOOM_CHECK(int64_t(ld) >= int64_t(std::max(Hq, Hkv)) * D, op, ": row stride ", ld,
             " below a head block");
  LOOM_CHECK(window >= 0 && softcap >= 0 && std::isfinite(softcap), op, ": window ", window,
             " and softcap ", softcap, " must be >= 0");
  LOOM_CHECK(nseq >= 0 && (nseq == 0 || cu), op, ": no cu_seqlens");
  for (int s = 0; s < nseq; ++s)
    LOOM_CHECK(cu[s + 1] >= cu[s], op, ": cu_seqlens decreases at ", s + 1);
}

// The first key query i (index within its sequence) sees.
inline int first_key(int i, int window) {
  return window > 0 ? std::max(0, i - window + 1) : 0;
}

}  // namespace

void attention_variant_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, int ld, const int32_t* cu, int nseq, int Hq, int Hkv,
                               int D, float scale, int window, float softcap) {
  check_args(cu, nseq, Hq, Hkv, D, ld, window, softcap, "attention_variant_forward");
  const int group = Hq / Hkv;
  const int64_t items = int64_t(nseq) * Hq;
#pragma omp parallel
  {
    std::vector<float> p;
    std::vector<float> acc(static_cast<size_t>(D));
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < items; ++it) {
      const int s = int(it / Hq), h = int(it % Hq), hk = h / group;
      const int start = cu[s], len = cu[s + 1] - cu[s];
      p.resize(size_t(std::max(len, 1)));
      for (int i = 0; i < len; ++i) {
        const float* qi = q + int64_t(start + i) * ld + int64_t(h) * D;
        const int j0 = first_key(i, window);
        float m = -INFINITY;
        for (int j = j0; j <= i; ++j) {
          const float z =
              cap_score(scale * dot(qi, k + int64_t(start + j) * ld + int64_t(hk) * D, D), softcap);
          p[size_t(j)] = z;
          m = std::max(m, z);
        }
        float l = 0;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int j = j0; j <= i; ++j) {
          const float e = std::exp(p[size_t(j)] - m);
          l += e;
          const float* vj = v + int64_t(start + j) * ld + int64_t(hk) * D;
          for (int d = 0; d < D; ++d) acc[size_t(d)] = std::fma(e, vj[d], acc[size_t(d)]);
        }
        float* o = out + int64_t(start + i) * Hq * D + int64_t(h) * D;
        for (int d = 0; d < D; ++d) o[d] = acc[size_t(d)] / l;
        lse[int64_t(start + i) * Hq + h] = m + std::log(l);
      }
    }
  }
}

void attention_variant_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                const float* k, const float* v, const float* out, const float* lse,
                                int ld, const int32_t* cu, int nseq, int Hq, int Hkv, int D,
                                float scale, int window, float softcap) {
  check_args(cu, nseq, Hq, Hkv, D, ld, window, softcap, "attention_variant_backward");
  const int group = Hq / Hkv;
  const int64_t items = int64_t(nseq) * Hkv;
  // One item per (sequence, kv head): it alone writes that head's dk, dv and its query heads'
  // dq rows, summing in a fixed order.
#pragma omp parallel for schedule(dynamic)
  for (int64_t it = 0; it < items; ++it) {
    const int s = int(it / Hkv), hk = int(it % Hkv);
    const int start = cu[s], len = cu[s + 1] - cu[s];
    for (int i = 0; i < len; ++i) {
      const int64_t r = int64_t(start + i) * ld;
      std::fill(dk + r + int64_t(hk) * D, dk + r + int64_t(hk + 1) * D, 0.f);
      std::fill(dv + r + int64_t(hk) * D, dv + r + int64_t(hk + 1) * D, 0.f);
      for (int h = hk * group; h < (hk + 1) * group; ++h)
        std::fill(dq + r + int64_t(h) * D, dq + r + int64_t(h + 1) * D, 0.f);
    }
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
      for (int i = 0; i < len; ++i) {
        const int64_t row = start + i;
        const float* qi = q + row * ld + int64_t(h) * D;
        const float* doi = dout + row * Hq * D + int64_t(h) * D;
        const float* oi = out + row * Hq * D + int64_t(h) * D;
        float* dqi = dq + row * ld + int64_t(h) * D;
        const float Di = dot(doi, oi, D), L = lse[row * Hq + h];
        for (int j = first_key(i, window); j <= i; ++j) {
          const int64_t kr = int64_t(start + j) * ld + int64_t(hk) * D;
          const float z = cap_score(scale * dot(qi, k + kr, D), softcap);
          const float p = std::exp(z - L);
          const float ds = p * (dot(doi, v + kr, D) - Di);
          const float dz = softcap > 0 ? ds * (1.f - (z / softcap) * (z / softcap)) : ds;
          const float g = scale * dz;
          for (int d = 0; d < D; ++d) {
            dqi[d] = std::fma(g, k[kr + d], dqi[d]);
            dk[kr + d] = std::fma(g, qi[d], dk[kr + d]);
            dv[kr + d] = std::fma(p, doi[d], dv[kr + d]);
          }
        }
      }
    }
  }
}

}  // namespace loom::cpu
