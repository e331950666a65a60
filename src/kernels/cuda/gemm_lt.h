// GEMMs through cuBLASLt. Row-major problems are posed to cuBLASLt (column-major) as the
// transposed product: C^T[N,M] = op(B)^T op(A)^T, i.e. the operands swap places and keep their
// leading dimensions. A plan (descriptors + the heuristic's algorithm) is built once per
// problem shape, types and pointer alignment, and cached: a training step re-plans nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/cuda/cuda_backend.h"

namespace loom::cuda {

// cuBLASLt compute type for the fp32-interface GEMMs of a GemmMath mode (as an int: the enum
// lives in cublas_api.h, which this header does not include).
int compute_type_of(GemmMath m);

// Largest power of two (<= 256) dividing the address: cuBLASLt picks kernels by alignment.
inline int pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

class LtGemm {
 public:
  LtGemm(void* workspace, size_t workspace_bytes, int sm);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // g.C is written (beta == 0: never read). compute_type: a cublasComputeType_t.
  void run(cudaStream_t st, const GemmEx& g, int compute_type);
  size_t cached_plans() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::cuda
