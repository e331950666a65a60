// Linear layers with weight-only low precision, for serving: y[M, N] = x[M, K] W^T (+ b) with W
// stored [N, K] as bf16 (2 bytes per weight), or int8 or fp8 E4M3 (1 byte) with one fp32 scale
// per output row (W[n, k] = scale[n] * q[n, k], q the int8 value or the decoded E4M3 value);
// x, y, the bias and every accumulation are fp32.
//   - M <= kLowpGemvRows (decode batches): a GEMV-style kernel that streams each weight row from
//     memory once for all M inputs, widening it in registers (AVX-512 when the CPU has it, a
//     scalar loop otherwise); output rows are split over the OpenMP threads. The bits of y[m]
//     depend only on x[m] and W, not on M or the thread count.
//   - larger M (prefill chunks): compute-bound, so blocks of W are widened to fp32 and multiplied
//     with the BLAS.
//   - on CPUs with AMX-BF16, every M >= kAmxMinRows (8) instead takes the tile path of
//     gemm_lowp_amx.h (exact products, fp32 sums in its own order: the bits of y[m] again depend
//     only on x[m] and W among such batches, but are not the GEMV's).
#pragma once

#include <cstdint>

namespace loom::cpu {

constexpr int kLowpGemvRows = 16;

void linear_bf16w(float* y, const float* x, const uint16_t* w, const float* b, int M, int K, int N);
void linear_int8w(float* y, const float* x, const int8_t* w, const float* scale, const float* b,
                  int M, int K, int N);
// w holds E4M3 codes (kernels/cpu/fp8.h) as quantize_fp8_rows writes them: never the NaN codes
// (0x7F, 0xFF), which this kernel does not decode as NaN.
void linear_fp8w(float* y, const float* x, const uint8_t* w, const float* scale, const float* b,
                 int M, int K, int N);

// The decode kernel on fp32 weights (any M, though it is meant for M <= kLowpGemvRows: it
// streams W once, where a BLAS GEMM with M = 1 reaches a fraction of the read bandwidth).
// Batches of 6 or more take a block of 8 rows that sums in the same order: the bits of y[m]
// depend only on x[m] and W for every M.
void gemv_f32w(float* y, const float* x, const float* w, const float* b, int M, int K, int N);

// The largest magnitude of every row: amax[n] = max|W[n, :]|, +infinity for a row holding a NaN or
// an infinity (so that a maximum taken over the pieces of a row, as MPI's, keeps it marked).
void row_amax(const float* w, int N, int K, float* amax);

// Symmetric per-row int8: scale[n] = max|W[n, :]| / 127 (1 for an all-zero row), q = round(W /
// scale) (to nearest, ties away from zero) in [-127, 127]. Returns false (q, scale unspecified)
// when a row holds a NaN or an infinity.
// `amax` (nullable) gives each row's largest magnitude instead of the row itself: a
// row-parallel tensor-parallel shard holds part of every row, and its scale must be the whole
// row's (the maximum over the shards, at least its own part's) for the shards to sum to what
// the whole matrix gives.
bool quantize_int8_rows(const float* w, int N, int K, int8_t* q, float* scale,
                        const float* amax = nullptr);

// Per-row E4M3 (OCP FN, max 448): q = E4M3(W * qs) with qs = 448 / max|W[n, :]| (1 for an
// all-zero row), rounded to nearest even, saturating at 448; scale[n] = 1 / qs. Returns false (q,
// scale unspecified) when a row holds a NaN or an infinity. `amax` as quantize_int8_rows's.
bool quantize_fp8_rows(const float* w, int N, int K, uint8_t* q, float* scale,
                       const float* amax = nullptr);

// Whether the AVX-512 kernels run (the CPU has AVX512F and tests have not turned them off).
bool lowp_uses_avx512();
void set_lowp_avx512(bool on);  // tests: false runs the scalar loops on an AVX-512 machine
// Whether fp8's single-input GEMV widens by byte permutes (by default on AVX512_VBMI CPUs
// without AVX512_FP16, where they are the faster way; the same bits as the AVX512BW steps, which
// set_lowp_vbmi(false) runs instead; set_lowp_vbmi(true) turns them on on any VBMI CPU).
bool lowp_uses_vbmi();
void set_lowp_vbmi(bool on);

}  // namespace loom::cpu
