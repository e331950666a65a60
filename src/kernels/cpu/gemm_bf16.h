// The door to bf16 GEMMs: A and B in bf16 (uint16_t storage, as core/dtype.h's f32_to_bf16
// writes it), products summed in fp32, C in fp32 or bf16. Same contract as blas.h's sgemm:
//   C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op(X) = X or X^T, leading dimensions
//   at least the stored width; beta == 0 overwrites C (NaNs in C included).
// Two paths, chosen once at run time:
//   - oneDNN's matmul primitive, when Loom was built with oneDNN (LOOM_USE_DNNL) and the CPU
//     has AVX512-BF16. Primitives are cached per shape and run on the OpenMP thread count in
//     force at the call (set_num_threads), in the same libgomp pool as OpenBLAS.
//   - otherwise the fallback: convert A and B to fp32 and run the fp32 GEMM (blas.h). A notice
//     saying why is logged once. LOOM_BF16_GEMM=fallback in the environment forces it.
// Both paths compute the same fp32 sums up to summation order; a bf16 C is the round-to-
// nearest-even rounding of the fp32 result. One difference below 2^-126 (~1.2e-38): the oneDNN
// path treats denormal inputs, products and results as zero (VDPBF16PS does), the fallback
// keeps them.
#pragma once

#include <cstdint>

namespace loom::cpu {

// fp32 C: beta != 0 accumulates into C (weight gradients).
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc);
// bf16 C: beta != 0 reads C as bf16, adds in fp32 and rounds once.
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, uint16_t* C, int ldc);

// C[M,N] = A[M,K] B^T + bias (B stored [N,K] row-major, bias [N] fp32, C fp32 overwritten): a
// linear layer's forward. oneDNN adds the bias in its kernel (no pass seeding C with the bias
// and no accumulation onto C); the fallback seeds C and accumulates, as a caller would.
void gemm_bf16_bias(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B, int ldb,
                    const float* bias, float* C, int ldc);

// gemm_bf16 with fp32 C, beta 0 or 1, for an alpha that changes from call to call (the fp8
// recipes' 1 / (scale_a * scale_b)), plus an fp32 bias row [N] added to every row of C when
// bias is non-null (beta 0 only). oneDNN compiles alpha into its primitive, so every new alpha
// would create one (a JIT compilation, milliseconds with AMX, and a cache entry used once);
// here the primitive runs with alpha 1 and beta 0 and alpha is applied in one pass over its
// fp32 result S (weight gradients: block by block, in cache): C = fl(alpha * S) + bias, or
// + C. That is the scaled fp32 sum, as cuBLASLt's scaled FP8 GEMM defines it; oneDNN's own
// output scale and sum post-op round differently (they apply alpha and add C inside its kernel,
// and select gemm:jit rather than the AMX brgemm kernel), so the bits differ from gemm_bf16 with
// that alpha by rounding. The fallback path is that gemm_bf16 call (on C seeded with the bias).
void gemm_bf16_varying_alpha(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                             const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta,
                             float* C, int ldc, const float* bias = nullptr);

// `batch` independent GEMMs of one shape, matrix b at X + b * stride_x (attention heads, MoE
// experts of equal size). A stride of 0 shares that operand across the batch.
void gemm_bf16_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                       const uint16_t* A, int lda, int64_t stride_a, const uint16_t* B, int ldb,
                       int64_t stride_b, float beta, float* C, int ldc, int64_t stride_c,
                       int batch);
void gemm_bf16_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                       const uint16_t* A, int lda, int64_t stride_a, const uint16_t* B, int ldb,
                       int64_t stride_b, float beta, uint16_t* C, int ldc, int64_t stride_c,
                       int batch);

// C[M,N] = A[M,K] B[K,N] (fp32 C overwritten) for a B that several calls read before it
// changes: the output head's input gradient dX = dY W, one call per chunk of rows, where oneDNN
// would repack the whole weight (77 MB for GPT-2) on every call. On the oneDNN path B is kept
// packed in the kernel's layout under `key` while `version` stays the same (the caller changes
// it whenever B's contents may have changed): the first call of a version reads the plain B,
// the second packs it, the later ones reuse the packed copy. Same bits as gemm_bf16 (the same
// kernel on the same values). The fallback path is plain gemm_bf16.
void gemm_bf16_reused_b(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B, int ldb,
                        float* C, int ldc, const void* key, uint64_t version);
// Frees what gemm_bf16_reused_b keeps under `key`.
void gemm_bf16_release(const void* key);

enum class Bf16GemmPath { OneDnn, Fallback };

// The path the calls above take now, and its name ("onednn" or "fallback (<reason>)").
Bf16GemmPath bf16_gemm_path();
const char* bf16_gemm_path_name();

// oneDNN primitives created by this process so far (0 on the fallback): tests check that a
// steady workload stops creating them.
uint64_t bf16_gemm_primitives_created();

// Tests and benchmarks: force the fallback (true) or go back to the automatic choice (false).
void force_bf16_gemm_fallback(bool force);

// What the automatic choice would find: oneDNN linked in, and the CPU's AVX512-BF16.
bool bf16_gemm_onednn_built();
bool cpu_has_avx512_bf16();

}  // namespace loom::cpu
