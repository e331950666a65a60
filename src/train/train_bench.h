// Training-throughput benchmark: full optimizer steps (forward, backward, AdamW) of a model
// preset on synthetic tokens, reported against this machine's measured sgemm peak.
#pragma once

#include <string>

#include "core/json.h"

namespace loom {

struct TrainBenchOptions {
  std::string preset = "gpt2-124m";
  int batch = 4, seq = 64, threads = 2, steps = 5, warmup = 1;
  std::string precision = "fp32", recompute = "none";
  std::string fp8 = "none", fp8_format = "e4m3";  // precision.fp8_recipe / fp8_format
  // cpu, cuda or auto (train/device.h). On cuda the model is stored in fp32 and the precision
  // picks the tensor-core math of its GEMMs (fp32: TF32; bf16: bf16 GEMMs and attention), and
  // MFU is against the GPU's dense bf16 peak (peak_tflops overrides it; 0 = by the GPU's name).
  std::string device = "cpu";
  double peak_tflops = 0;
};

// Runs the benchmark, prints a readable report, returns the figures (tokens_per_s, gflops,
// gemm_path, gemm_peak_gflops, ratio_to_gemm_peak, activation_mb, peak_rss_mb, ...).
Json run_train_bench(const TrainBenchOptions& o);

}  // namespace loom
