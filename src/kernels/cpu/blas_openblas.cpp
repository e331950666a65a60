#include <cblas.h>

#include "kernels/cpu/blas.h"

namespace loom::cpu {

void blas_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int blas_threads() {
  return openblas_get_num_threads();
}
void set_blas_threads(int n) {
  openblas_set_num_threads(n);
}
const char* blas_name() {
  return "openblas";
}

}  // namespace loom::cpu
