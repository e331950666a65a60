#include <omp.h>

#include "kernels/cpu/blas.h"

namespace loom::cpu {

void blas_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  portable_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int blas_threads() {
  return omp_get_max_threads();
}
void set_blas_threads(int) {}  // portable_sgemm uses the OpenMP thread count
const char* blas_name() {
  return "portable";
}
const char* blas_core() {
  return "portable";
}

}  // namespace loom::cpu
