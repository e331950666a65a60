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

// The rules, from the cuBLAS documentation of cublasLtMatmul() ("FP8 ... the following set of
// requirements must be satisfied") and of its data-type table and Tensor Core usage:
//  - fp8 tensor cores: compute capability 8.9 (Ada) or 9.0 (Hopper) and newer;
//  - "A must be transposed and B non-transposed (the TN format)" on Ada and Hopper. cuBLASLt
//    is column-major and gemm_lt poses C^T = op(B)^T op(A)^T, so its A is our B: our A
//    untransposed [M,K], our B stored [N,K] (trans_b);
//  - both operands fp8, and not both e5m2 (the table lists e4m3 x e4m3, e4m3 x e5m2 and
//    e5m2 x e4m3 only: gradients in e5m2 always meet e4m3 weights or activations);
//  - scales: device pointers to fp32 (the compute type's) values; the scale pointers 16-byte
//    aligned (refused at launch otherwise, seen on an H200);
//  - "all matrix dimensions must meet the optimal requirements listed in Tensor Core Usage":
//    pointers of A, B, C 16-byte aligned, leading dimensions and the reduction length a
//    multiple of 16 bytes, and the output's contiguous dimension (cuBLASLt's m, our N) too;
//  - a bias epilogue with fp32 output wants a bf16 bias (the bias-type rule for fp8 kernels):
//    Loom seeds C with the fp32 bias and accumulates (beta 1) instead, so none is passed.
void check_fp8_gemm(const GemmEx& g, int sm) {
  LOOM_CHECK(sm >= 89, "gemm (cuda): fp8 needs sm_89 or newer (this device is sm_", sm, ")");
  LOOM_CHECK(is_fp8(g.a_type) && is_fp8(g.b_type), "gemm (cuda): fp8 needs both operands fp8, got ",
             dtype_name(g.a_type), " x ", dtype_name(g.b_type));
  LOOM_CHECK(!(g.a_type == DType::F8E5M2 && g.b_type == DType::F8E5M2),
             "gemm (cuda): e5m2 x e5m2 is not a cuBLASLt fp8 combination (e4m3 x e4m3, ",
             "e4m3 x e5m2 and e5m2 x e4m3 are)");
  LOOM_CHECK(!g.trans_a && g.trans_b,
             "gemm (cuda): fp8 operands must be A[M,K] (not transposed) and B stored [N,K] "
             "(trans_b), the only layout cuBLASLt supports for fp8");
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
