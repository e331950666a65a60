// The pass that applies a GEMM's alpha after the GEMM (gemm_bf16_varying_alpha): the GEMM runs
// with alpha 1, so one compiled oneDNN primitive serves every alpha.
#pragma once

namespace loom::cpu {

// C[i, j] = alpha * S[i, j], plus bias[j] (bias non-null) or plus C[i, j] (add_c; not both),
// for i < rows, j < cols. alpha * S is rounded to fp32 before any addition (this file is compiled
// without floating-point contraction: no fused multiply-add, on every compiler and CPU alike).
// S may be C itself (in place, lds == ldc).
void gemm_scale_pass(int rows, int cols, float alpha, const float* S, int lds, const float* bias,
                     bool add_c, float* C, int ldc);

}  // namespace loom::cpu
