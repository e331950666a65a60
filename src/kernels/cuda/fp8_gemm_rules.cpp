#include "kernels/cuda/fp8_gemm_rules.h"

#include <cstdint>

#include "core/error.h"

namespace loom::cuda {
namespace {
bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
}  // namespace

bool is_fp8(DType t) {
  return t == DType::F8E4M3 || t == DType::F8E5M2;
}

// The rules, and where each comes from. Sources: the cuBLAS Library documentation (CUDA 12.x /
// 13.x), cublasLtMatmul(): "To use FP8 kernels, the following set of requirements must be
// satisfied" (quoted in NVIDIA's developer forum, "Why is TN format required for FP8 in
// cublasLtMatmul", 2024), its table of FP8 type combinations, and section 2.1.11 "Tensor Core
// Usage"; and the attribute comments of cublasLt.h (CUDA 13.0, checked against the installed
// header): CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE.
//  - fp8 tensor cores: compute capability 8.9 (Ada) or 9.0 (Hopper) and newer.
//  - Layout: "A must be transposed and B non-transposed (the TN format)", a requirement the
//    documentation states for Ada, Hopper and GeForce Blackwell (sm_120); sm_100 also takes
//    other layouts. cuBLASLt is column-major and gemm_lt poses C^T = op(B)^T op(A)^T, so its A
//    is our B: TN is our A untransposed [M,K] and our B stored [N,K] (trans_b). CudaFp8Linear
//    poses only this layout (its backward reads transposed codes), so it is required on every
//    GPU here: the one layout that has run.
//  - Types: both operands fp8, and not both e5m2 (the table lists e4m3 x e4m3, e4m3 x e5m2
//    and e5m2 x e4m3 only: gradients in e5m2 always meet e4m3 weights or activations); C = D
//    in fp32, bf16 or fp16 (fp8 D outputs are not used here).
//  - Compute type CUBLAS_COMPUTE_32F and scale type CUDA_R_32F (the requirements list): met
//    by CudaBackend::gemm_ex, which runs every fp8 GEMM with them whatever the fp32 GEMM math.
//  - Scales: device pointers to values "of the same type as the compute type" (cublasLt.h):
//    fp32. 16-byte alignment of the scale pointers is not in the documentation; cuBLASLt
//    refused misaligned ones at launch on the first H200 run, so it is checked as well.
//  - "All matrix dimensions must meet the optimal requirements listed in Tensor Core Usage":
//    A, B and C pointers 16-byte aligned; for cuBLASLt's A (op T) and B (op N) the reduction
//    length k, and lda / ldb, multiples of 16 bytes (16 fp8 elements); its m (our N) and ldc
//    times the output's element size multiples of 16 bytes; batch strides likewise. Our M
//    (cuBLASLt's n) is free.
//  - Bias: the epilogue bias of an fp8 kernel with fp32 output must be bf16 (cublasLt.h's
//    BIAS_DATA_TYPE note and the documentation's table): Loom seeds C with the fp32 bias and
//    accumulates (beta 1) instead, so none is passed.
void check_fp8_gemm(const GemmEx& g, int sm) {
  LOOM_CHECK(sm >= 89, "gemm (cuda): fp8 needs sm_89 or newer (this device is sm_", sm, ")");
  LOOM_CHECK(is_fp8(g.a_type) && is_fp8(g.b_type), "gemm (cuda): fp8 needs both operands fp8, got ",
             dtype_name(g.a_type), " x ", dtype_name(g.b_type));
  LOOM_CHECK(!(g.a_type == DType::F8E5M2 && g.b_type == DType::F8E5M2),
             "gemm (cuda): e5m2 x e5m2 is not a cuBLASLt fp8 combination (e4m3 x e4m3, ",
             "e4m3 x e5m2 and e5m2 x e4m3 are)");
  LOOM_CHECK(!g.trans_a && g.trans_b,
             "gemm (cuda): fp8 operands must be A[M,K] (not transposed) and B stored [N,K] "
             "(trans_b), the TN layout cuBLASLt's fp8 kernels require on Ada and Hopper (the only "
             "layout Loom's fp8 GEMMs pose)");
  LOOM_CHECK(g.a_scale && g.b_scale, "gemm (cuda): fp8 needs per-tensor scales a_scale/b_scale");
  LOOM_CHECK(aligned16(g.a_scale) && aligned16(g.b_scale),
             "gemm (cuda): fp8 scale pointers must be 16-byte aligned (cuBLASLt refuses others "
             "at launch)");
  LOOM_CHECK(!g.bias, "gemm (cuda): bias is not supported with fp8 operands");
  LOOM_CHECK(g.c_type == DType::F32 || g.c_type == DType::BF16 || g.c_type == DType::F16,
             "gemm (cuda): fp8 output must be fp32, bf16 or fp16, got ", dtype_name(g.c_type));
  const int64_t c_bytes = g.c_type == DType::F32 ? 4 : 2;
  LOOM_CHECK(aligned16(g.A) && aligned16(g.B) && aligned16(g.C),
             "gemm (cuda): fp8 operands and output must be 16-byte aligned (cuBLASLt's Tensor ",
             "Core requirements, mandatory for fp8)");
  LOOM_CHECK(g.K % 16 == 0 && g.lda % 16 == 0 && g.ldb % 16 == 0,
             "gemm (cuda): fp8 needs K, lda and ldb multiples of 16 (16 bytes of fp8), got K=", g.K,
             " lda=", g.lda, " ldb=", g.ldb);
  LOOM_CHECK(int64_t(g.ldc) * c_bytes % 16 == 0 && int64_t(g.N) * c_bytes % 16 == 0,
             "gemm (cuda): fp8 needs the output's rows (N=", g.N, ", ldc=", g.ldc,
             ") a multiple of 16 bytes of ", dtype_name(g.c_type));
  LOOM_CHECK(g.batch == 1 ||
                 (g.stride_a % 16 == 0 && g.stride_b % 16 == 0 && g.stride_c * c_bytes % 16 == 0),
             "gemm (cuda): fp8 batch strides must keep every matrix 16-byte aligned");
}

}  // namespace loom::cuda
