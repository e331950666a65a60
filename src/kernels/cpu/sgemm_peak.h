// The machine's OpenBLAS sgemm throughput: the baseline that training-speed figures are
// reported against ("x% of sgemm peak").
#pragma once

namespace loom {

// Best GFLOP/s of a square n x n x n row-major sgemm over `reps` timed runs (after one warm-up)
// with OpenBLAS limited to `threads` threads (0 = its current setting). Restores the previous
// OpenBLAS thread count. Takes about reps * 2n^3 / peak seconds (~0.5 s for n = 2048).
double measure_sgemm_peak_gflops(int threads, int n = 2048, int reps = 3);

}  // namespace loom
