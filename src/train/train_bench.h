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
  // cpu, cuda or auto (train/device.h). On cuda the step is the trainer's (the policy's
  // storage, GEMMs on the tensor cores of its type, TF32 under fp32) and MFU is against the
  // GPU's dense bf16 peak (peak_tflops overrides it; 0 = known by the GPU's name); fp8 there is
  // the trainer's GPU recipe (precision/device_fp8.h).
  std::string device = "cpu";
  double peak_tflops = 0;
};

// Runs the benchmark, prints a readable report, returns the figures (tokens_per_s, gflops,
// gemm_path, gemm_peak_gflops, ratio_to_gemm_peak, activation_mb, peak_rss_mb, ...).
Json run_train_bench(const TrainBenchOptions& o);

}  // namespace loom
