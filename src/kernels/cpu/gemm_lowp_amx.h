// Weight-only linear layers (gemm_lowp.h) for batches of kAmxMinRows inputs or more on CPUs with
// AMX-BF16: y[M, N] = x[M, K] W^T (* scale) (+ b) on the tile unit, which multiplies bf16 pairs
// and sums them in fp32 at several times the FMA units' rate. Every weight (bf16, int8, E4M3)
// is exactly a bf16 number, and each fp32 input is split exactly into three bf16 parts (x = x1 +
// x2 + x3, each the truncation of what is left), so every product is exact and the result
// differs from the GEMV's only by the order and rounding of fp32 sums (no input is rounded to
// bf16). The bits of y[m] depend only on x[m] and W (every element is one fixed sequence of tile
// operations), not on M or the thread count; they are not the GEMV's bits, which M below
// kAmxMinRows keeps.
// AMX rounds sums to nearest even and treats inputs, products and sums below fp32's normal range
// (|v| < 2^-126) as zero.
#pragma once

#include <cstdint>

namespace loom::cpu {

// The smallest batch that takes the tile path: below it the GEMV streams the weights at the read
// bandwidth with fewer instructions (measured: docs/serving.md, "AMX machine").
constexpr int kAmxMinRows = 8;

// Whether the tile path runs: the CPU has AMX-BF16 (and AVX512_BF16, VBMI), Linux granted the
// tile state, LOOM_LOWP_AMX=0 is not in the environment, and tests have turned off neither it
// nor the AVX-512 loops (set_lowp_avx512).
bool lowp_uses_amx();
void set_lowp_amx(bool on);  // tests and benchmarks: false keeps every M on the other paths

// y = x W^T for W [N, K] as bf16 words, int8 values or E4M3 codes (the NaN codes read as +-480,
// as the GEMV reads them), times scale[n] when scale is given, plus b[n] when b is given.
// Returns false, y untouched, when the tile path does not apply (not lowp_uses_amx(), M <
// kAmxMinRows, or K not a multiple of 32).
bool amx_linear_bf16w(float* y, const float* x, const uint16_t* w, const float* b, int M, int K,
                      int N);
bool amx_linear_int8w(float* y, const float* x, const int8_t* w, const float* scale, const float* b,
                      int M, int K, int N);
bool amx_linear_fp8w(float* y, const float* x, const uint8_t* w, const float* scale, const float* b,
                     int M, int K, int N);

}  // namespace loom::cpu
