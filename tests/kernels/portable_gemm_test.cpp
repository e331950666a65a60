// The portable GEMM (used when no OpenBLAS is found) against a float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/blas.h"

using namespace loom;

namespace {

void check(bool ta, bool tb, int M, int N, int K, float alpha, float beta) {
  // Leading dimensions padded by 3 so strides are exercised too.
  const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 3, ldc = N + 3;
  std::vector<float> A(size_t((ta ? K : M)) * lda), B(size_t((tb ? N : K)) * ldb),
      C(size_t(M) * ldc);
  for (size_t i = 0; i < A.size(); ++i) A[i] = normal_at(1, 1, i);
  for (size_t i = 0; i < B.size(); ++i) B[i] = normal_at(1, 2, i);
  for (size_t i = 0; i < C.size(); ++i) C[i] = beta == 0.f ? NAN : normal_at(1, 3, i);
  std::vector<float> C0 = C;
  cpu::portable_sgemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0;
      for (int k = 0; k < K; ++k) {
        double a = ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k];
        double b = tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j];
        ref += a * b;
      }
      ref = alpha * ref + (beta == 0.f ? 0.0 : beta * double(C0[size_t(i) * ldc + j]));
      ASSERT_NEAR(C[size_t(i) * ldc + j], ref, 1e-4 * (1 + std::sqrt(double(K))))
          << "ta=" << ta << " tb=" << tb << " (" << i << "," << j << ")";
    }
  // The padding columns of C are never written.
  for (int i = 0; i < M; ++i)
    for (int j = N; j < ldc; ++j)
      ASSERT_TRUE(std::isnan(C[size_t(i) * ldc + j]) == std::isnan(C0[size_t(i) * ldc + j]));
}

}  // namespace

TEST(PortableGemm, AllTranspositionsAcrossBlockBoundaries) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check(ta, tb, 70, 530, 300, 1.f, 0.f);  // crosses the 64 x 256 x 512 blocks
      check(ta, tb, 5, 7, 3, 0.5f, 0.25f);
    }
}

TEST(PortableGemm, EmptyKScalesByBeta) {
  check(false, false, 4, 6, 0, 1.f, 2.f);
}

TEST(PortableGemm, BlasDoorReportsItsImplementation) {
  std::string name = cpu::blas_name();
  EXPECT_TRUE(name == "openblas" || name == "portable") << name;
}
