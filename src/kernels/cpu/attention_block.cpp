// Full block attention (see attention_block.h), tile by tile: an online softmax over key tiles
// of kT rows in the forward (memory linear in the block sizes), and in the backward P and dS
// recomputed per (query tile, key tile) from the final log-sum-exp, as FlashAttention-2 does.
// The inner loops are plain C++ over contiguous rows of D floats, which the compiler
// vectorises; the ring loop's cost is dominated by these tile products.
#include "kernels/cpu/attention_block.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace loom::cpu {
namespace {

constexpr int kT = 64;  // rows per query tile = rows per key tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check(int ldq, int ldk, int nq, int nk, int Hq, int Hkv, int D, float scale, const char* op) {
  LOOM_CHECK(Hq > 0 && Hkv > 0 && D > 0 && Hq % Hkv == 0, op, ": bad head counts/dim Hq=", Hq,
             " Hkv=", Hkv, " D=", D);
  LOOM_CHECK(nq >= 0 && nk >= 0, op, ": negative row counts nq=", nq, " nk=", nk);
  LOOM_CHECK(ldq >= Hq * D && ldk >= Hkv * D, op, ": row strides ldq=", ldq, " ldk=", ldk,
             " smaller than the heads (", Hq, "x", D, ", ", Hkv, "x", D, ")");
  LOOM_CHECK(scale > 0 && std::isfinite(scale), op, ": scale=", scale, " must be positive");
}

inline float dot(const float* a, const float* b, int D) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

inline void axpy(float* y, float a, const float* x, int D) {
#pragma omp simd
  for (int d = 0; d < D; ++d) y[d] += a * x[d];
}

// S[r][j] = scale * q_r . k_j for the rows of one query tile and one key tile.
void scores(float* s, const float* q, int ldq, const float* k, int ldk, int nr, int nc, int D,
            float scale) {
  for (int r = 0; r < nr; ++r)
    for (int j = 0; j < nc; ++j)
      s[r * kT + j] = scale * dot(q + int64_t(r) * ldq, k + int64_t(j) * ldk, D);
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k,
                             const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                             float scale) {
  check(ldq, ldk, nq, nk, Hq, Hkv, D, scale, "attention_block_forward");
  const int group = Hq / Hkv, nqt = (nq + kT - 1) / kT;
  const int64_t items = int64_t(Hq) * nqt;
#pragma omp parallel if (items > 1)
  {
    std::vector<float> s(size_t(kT) * kT), o(size_t(kT) * D), m(kT), l(kT);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int h = int(it / nqt), qt = int(it % nqt), hk = h / group;
      const int i0 = qt * kT, nr = std::min(kT, nq - i0);
      const float* qh = q + int64_t(i0) * ldq + int64_t(h) * D;
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.f);
      std::fill(o.begin(), o.end(), 0.f);
      for (int j0 = 0; j0 < nk; j0 += kT) {
        const int nc = std::min(kT, nk - j0);
        const float* kh = k + int64_t(j0) * ldk + int64_t(hk) * D;
        const float* vh = v + int64_t(j0) * ldk + int64_t(hk) * D;
        scores(s.data(), qh, ldq, kh, ldk, nr, nc, D, scale);
        for (int r = 0; r < nr; ++r) {
          float* sr = s.data() + r * kT;
          float mx = m[r];
          for (int j = 0; j < nc; ++j) mx = std::max(mx, sr[j]);
          const float alpha = std::exp(m[r] - mx);  // 0 on the first tile (m = -inf)
          float* orow = o.data() + size_t(r) * D;
          if (alpha != 1.f) {
            l[r] *= alpha;
            for (int d = 0; d < D; ++d) orow[d] *= alpha;
          }
          m[r] = mx;
          float sum = 0;
          for (int j = 0; j < nc; ++j) {
            const float p = std::exp(sr[j] - mx);
            sum += p;
            axpy(orow, p, vh + int64_t(j) * ldk, D);
          }
          l[r] += sum;
        }
      }
      for (int r = 0; r < nr; ++r) {
        float* dst = out + int64_t(i0 + r) * Hq * D + int64_t(h) * D;
        const float inv = l[r] > 0 ? 1.f / l[r] : 0.f;
        for (int d = 0; d < D; ++d) dst[d] = o[size_t(r) * D + d] * inv;
        lse[int64_t(i0 + r) * Hq + h] = l[r] > 0 ? m[r] + std::log(l[r]) : kNegInf;
      }
    }
  }
}

void attention_block_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, int ldq, const float* k,
                              const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                              float scale) {
  check(ldq, ldk, nq, nk, Hq, Hkv, D, scale, "attention_block_backward");
  if (nq == 0 || nk == 0) return;
  const int group = Hq / Hkv, nqt = (nq + kT - 1) / kT, nkt = (nk + kT - 1) / kT;
  const int64_t ldo = int64_t(Hq) * D;
  std::vector<float> delta(size_t(nq) * Hq);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(nq) * Hq; ++i)
    delta[size_t(i)] = dot(dout + i * D, out + i * D, D);  // [nq, Hq] rows of D are contiguous

  // P and dS of query tile (h, i0..i0+nr) against key tile (hk, j0..j0+nc).
  auto tile = [&](float* p, float* ds, int h, int i0, int nr, int j0, int nc) {
    const int hk = h / group;
    const float* qh = q + int64_t(i0) * ldq + int64_t(h) * D;
    const float* kh = k + int64_t(j0) * ldk + int64_t(hk) * D;
    const float* vh = v + int64_t(j0) * ldk + int64_t(hk) * D;
    scores(p, qh, ldq, kh, ldk, nr, nc, D, scale);
    for (int r = 0; r < nr; ++r) {
      const int64_t row = int64_t(i0 + r) * Hq + h;
      const float L = lse[row], dl = delta[size_t(row)];
      const float* g = dout + row * D;
      for (int j = 0; j < nc; ++j) {
        const float pj = L == kNegInf ? 0.f : std::exp(p[r * kT + j] - L);
        p[r * kT + j] = pj;
        ds[r * kT + j] = pj * (dot(g, vh + int64_t(j) * ldk, D) - dl);
      }
    }
  };

  // dK and dV: one item per (kv head, key tile), over every query tile of the group's heads.
  const int64_t kv_items = int64_t(Hkv) * nkt, q_items = int64_t(Hq) * nqt;
#pragma omp parallel
  {
    std::vector<float> p(size_t(kT) * kT), ds(size_t(kT) * kT);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t it = 0; it < kv_items; ++it) {
      const int hk = int(it / nkt), j0 = int(it % nkt) * kT, nc = std::min(kT, nk - j0);
      for (int h = hk * group; h < (hk + 1) * group; ++h)
        for (int i0 = 0; i0 < nq; i0 += kT) {
          const int nr = std::min(kT, nq - i0);
          tile(p.data(), ds.data(), h, i0, nr, j0, nc);
          for (int j = 0; j < nc; ++j) {
            float* dkj = dk + int64_t(j0 + j) * ldk + int64_t(hk) * D;
            float* dvj = dv + int64_t(j0 + j) * ldk + int64_t(hk) * D;
            for (int r = 0; r < nr; ++r) {
              axpy(dvj, p[r * kT + j], dout + (int64_t(i0 + r) * Hq + h) * D, D);
              axpy(dkj, scale * ds[r * kT + j], q + int64_t(i0 + r) * ldq + int64_t(h) * D, D);
            }
          }
        }
    }
    // dQ: one item per (query head, query tile), over every key tile.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < q_items; ++it) {
      const int h = int(it / nqt), i0 = int(it % nqt) * kT, nr = std::min(kT, nq - i0);
      const int hk = h / group;
      for (int j0 = 0; j0 < nk; j0 += kT) {
        const int nc = std::min(kT, nk - j0);
        tile(p.data(), ds.data(), h, i0, nr, j0, nc);
        for (int r = 0; r < nr; ++r) {
          float* dqr = dq + int64_t(i0 + r) * ldq + int64_t(h) * D;
          for (int j = 0; j < nc; ++j)
            axpy(dqr, scale * ds[r * kT + j], k + int64_t(j0 + j) * ldk + int64_t(hk) * D, D);
        }
      }
    }
  }
  (void)ldo;
}

}  // namespace loom::cpu
