// GEMM and the linear layer on the BLAS (blas.h: OpenBLAS, or the portable fallback).

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace loom::cpu {
namespace {

// OpenBLAS runs a GEMM on one thread when M*N*K is at most 65536 * GEMM_MULTITHREAD_THRESHOLD
// (4 by default); batches of such GEMMs are spread over OpenMP threads instead.
constexpr double kSingleThreadedGemmWork = 65536.0 * 4.0;

void check_gemm_args(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb, int ldc) {
  LOOM_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  // Row-major leading dimensions: at least the number of stored columns.
  const int a_cols = trans_a ? M : K;
  const int b_cols = trans_b ? K : N;
  LOOM_CHECK(lda >= std::max(1, a_cols), "gemm: lda=", lda, " < ", a_cols);
  LOOM_CHECK(ldb >= std::max(1, b_cols), "gemm: ldb=", ldb, " < ", b_cols);
  LOOM_CHECK(ldc >= std::max(1, N), "gemm: ldc=", ldc, " < ", N);
}

// C = beta * C for an empty inner dimension (K == 0); beta == 0 clears C, NaNs included.
void scale_c(int M, int N, float beta, float* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    float* c = C + static_cast<int64_t>(i) * ldc;
    for (int j = 0; j < N; ++j) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  blas_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta,
                  float* C, int ldc, int64_t stride_c, int batch) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  LOOM_CHECK(batch >= 0, "gemm_batched: negative batch ", batch);
  if (M == 0 || N == 0 || batch == 0) return;
  const double work = static_cast<double>(M) * N * K;
  if (work > kSingleThreadedGemmWork) {
    // Large matrices: OpenBLAS threads each GEMM itself.
    for (int b = 0; b < batch; ++b)
      gemm(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta,
           C + b * stride_c, ldc);
    return;
  }
  // Small matrices: one GEMM per OpenMP thread. Each GEMM still runs single-threaded inside
  // OpenBLAS, so the bits do not depend on how the batch is split.
  const bool spread = batch > 1 && work * batch >= 4.0 * static_cast<double>(kMinParallelWork);
#pragma omp parallel for schedule(static) if (spread)
  for (int b = 0; b < batch; ++b) {
    const float* a = A + b * stride_a;
    const float* bb = B + b * stride_b;
    float* c = C + b * stride_c;
    if (K == 0) {
      scale_c(M, N, beta, c, ldc);
    } else {
      blas_sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, bb, ldb, beta, c, ldc);
    }
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC) {
  if (N == 0 || OC == 0) return;
  float beta = 0.0f;
  if (bias != nullptr) {
    // Seed out with the bias so the GEMM adds onto it (beta = 1): no second pass over out.
#pragma omp parallel for schedule(static) if (worth_parallel(N, OC))
    for (int i = 0; i < N; ++i) {
      float* o = out + static_cast<int64_t>(i) * OC;
#pragma omp simd
      for (int j = 0; j < OC; ++j) o[j] = bias[j];
    }
    beta = 1.0f;
  }
  // out[N,OC] = inp[N,IC] * weight[OC,IC]^T
  gemm(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
  // dinp[N,IC] = dout[N,OC] * weight[OC,IC]  (written)
  if (dinp != nullptr) gemm(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
  // dweight[OC,IC] += dout^T[OC,N] * inp[N,IC]  (accumulated)
  if (dweight != nullptr) gemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias != nullptr) {
    // dbias += column sums of dout. Each thread owns whole columns and sums rows in order, so
    // the bits do not depend on the thread count.
    constexpr int kCols = 64;
    const int nblocks = (OC + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (worth_parallel(N, OC))
    for (int blk = 0; blk < nblocks; ++blk) {
      const int j0 = blk * kCols;
      const int w = std::min(kCols, OC - j0);
      double acc[kCols] = {};
      for (int i = 0; i < N; ++i) {
        const float* d = dout + static_cast<int64_t>(i) * OC + j0;
#pragma omp simd
        for (int j = 0; j < w; ++j) acc[j] += d[j];
      }
      for (int j = 0; j < w; ++j) dbias[j0 + j] += static_cast<float>(acc[j]);
    }
  }
}

}  // namespace loom::cpu
