// The machine's bf16 GEMM throughput on the GPT-2 124M training shapes: the baseline that bf16
// training-speed figures are reported against, as measure_sgemm_peak_gflops is for fp32.
#pragma once

namespace loom {

// GFLOP/s of gemm_bf16 (whichever path bf16_gemm_path() takes) over the transformer block's
// linear layers of GPT-2 124M (C = 768: qkv 768->2304, proj 768->768, fc 768->3072, fc_proj
// 3072->768) for `tokens` rows, each in its three training layouts: forward out = x W^T (bf16
// out), dinp = dout W (bf16 out) and dweight += dout^T x (fp32, beta = 1). Total flops over
// the sum of each GEMM's best time of `reps` runs (after one warm-up), with OpenMP/OpenBLAS
// limited to `threads` threads (0 = the current setting), restored afterwards. About
// 87 GFLOP per rep at tokens = 2048 (~0.2 s at 440 GFLOP/s).
double measure_bf16_gemm_peak_gflops(int threads, int tokens = 2048, int reps = 3);

}  // namespace loom
