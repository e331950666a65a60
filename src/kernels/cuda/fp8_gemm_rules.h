// What cuBLASLt requires of an fp8 GEMM (GemmEx with e4m3/e5m2 operands), checked on the host
// before the plan or the launch, so that a violation is an error naming the rule instead of
// CUBLAS_STATUS_NOT_SUPPORTED at launch (what the first H200 run met with misaligned scales).
// No CUDA call: host tests run it without a GPU (tests/cuda/fp8_gemm_rules_test.cpp).
#pragma once

#include "kernels/cuda/cuda_backend.h"

namespace loom::cuda {

bool is_fp8(DType t);

// Throws an Error naming the rule `g` breaks on a device of compute capability `sm` (10 * major
// + minor); g is in Loom's row-major convention (C[M,N] = op(A) op(B), gemm_lt.h).
void check_fp8_gemm(const GemmEx& g, int sm);

}  // namespace loom::cuda
