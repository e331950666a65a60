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

}  // namespace loom::cpu::detail
