// The one door to a BLAS. With OpenBLAS (Debian's OpenMP build) these forward to it; without it
// (the GPU machine has only the CUDA toolkit) they use portable_sgemm, so the trainer core
// builds with a bare toolchain, as docs/architecture.md promises.
#pragma once

namespace loom::cpu {

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major.
void blas_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc);
int blas_threads();
void set_blas_threads(int n);
const char* blas_name();  // "openblas" or "portable"
const char* blas_core();  // the kernels it runs (OpenBLAS's core name), or "portable"

// A cache-blocked OpenMP GEMM with the same contract, always built (and tested) so the
// fallback cannot rot: correct first, reasonably fast, far from a tuned BLAS.
void portable_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc);

}  // namespace loom::cpu
