// Internal to gemm_bf16.cpp: the oneDNN path, built from gemm_bf16_dnnl.cpp when Loom links
// oneDNN and from gemm_bf16_nodnnl.cpp (which says "not built") otherwise.
#pragma once

#include <cstdint>

namespace loom::cpu::detail {

bool dnnl_built();
// oneDNN's own view of the CPU (honours DNNL_MAX_CPU_ISA): true when it may use AVX512-BF16.
bool dnnl_isa_has_bf16();

// One (batched) GEMM through oneDNN's matmul; C is bf16 when c_bf16, else fp32. Returns false,
// without touching C, when oneDNN offers no optimised kernel for this layout (the caller then
// takes the fallback). Sizes are positive and already checked.
bool dnnl_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
                    int lda, int64_t stride_a, const uint16_t* B, int ldb, int64_t stride_b,
                    float beta, void* C, bool c_bf16, int ldc, int64_t stride_c, int batch);

// C[M,N] = A[M,K] B[K,N] (fp32 C, beta 0, nothing transposed) with B kept packed in the
// primitive's own layout under `key` while `version` (and B, K, N, ldb) stay the same: packed
// on the second call, reused by the later ones. Returns false, without touching C, as above.
bool dnnl_gemm_bf16_reused_b(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                             int ldb, float* C, int ldc, const void* key, uint64_t version);
// Frees the packed copy kept under `key` (nothing when there is none).
void dnnl_release_reused_b(const void* key);
// C[M,N] = A[M,K] B^T + bias (B stored [N,K]), the bias added in the kernel.
bool dnnl_gemm_bf16_bias(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                         int ldb, const float* bias, float* C, int ldc);

// gemm_bf16_varying_alpha's oneDNN path (beta 0 or 1; bias only with beta 0). Returns false,
// without touching C, as above.
bool dnnl_gemm_bf16_varying_alpha(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                  const uint16_t* A, int lda, const uint16_t* B, int ldb,
                                  float beta, float* C, int ldc, const float* bias);
// oneDNN primitives created so far (each a JIT compilation).
uint64_t dnnl_primitives_created();

}  // namespace loom::cpu::detail
