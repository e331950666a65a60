#include <algorithm>
#include <vector>

#include "kernels/cpu/blas.h"

namespace loom::cpu {

namespace {
constexpr int kMc = 64, kKc = 256, kNc = 512;  // block sizes: an A block and a B panel in L2

// Copies op(X)[r0:r0+rows, c0:c0+cols] into a dense row-major block, so the inner loop reads
// contiguous memory whatever the transposition.
void pack(const float* X, int ld, bool trans, int r0, int rows, int c0, int cols, float* out) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out[r * cols + c] = trans ? X[static_cast<long>(c0 + c) * ld + (r0 + r)]
                                : X[static_cast<long>(r0 + r) * ld + (c0 + c)];
}
}  // namespace

void portable_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  // Scale C by beta first (beta == 0 overwrites, so NaNs in C do not leak, as in BLAS).
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; ++i) {
    float* c = C + static_cast<long>(i) * ldc;
    for (int j = 0; j < N; ++j) c[j] = beta == 0.f ? 0.f : beta * c[j];
  }
  if (K == 0 || alpha == 0.f) return;
  for (int k0 = 0; k0 < K; k0 += kKc) {
    const int kc = std::min(kKc, K - k0);
    for (int n0 = 0; n0 < N; n0 += kNc) {
      const int nc = std::min(kNc, N - n0);
      std::vector<float> bp(static_cast<size_t>(kc) * nc);
      pack(B, ldb, trans_b, k0, kc, n0, nc, bp.data());
      // Row blocks of C are independent: threads never write the same element, and each
      // element's sum runs over k in the same order for any thread count (deterministic).
#pragma omp parallel for schedule(dynamic)
      for (int m0 = 0; m0 < M; m0 += kMc) {
        const int mc = std::min(kMc, M - m0);
        std::vector<float> ap(static_cast<size_t>(mc) * kc);
        pack(A, lda, trans_a, m0, mc, k0, kc, ap.data());
        for (int i = 0; i < mc; ++i) {
          float* c = C + static_cast<long>(m0 + i) * ldc + n0;
          for (int k = 0; k < kc; ++k) {
            const float a = alpha * ap[i * kc + k];
            const float* b = bp.data() + static_cast<size_t>(k) * nc;
#pragma omp simd
            for (int j = 0; j < nc; ++j) c[j] += a * b[j];
          }
        }
      }
    }
  }
}

}  // namespace loom::cpu
