#include "train/train_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "core/bench_util.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/gemm_bf16_peak.h"
#include "kernels/cpu/sgemm_peak.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "precision/bf16_gemms.h"
#include "precision/device_fp8.h"
#include "precision/fp8_recipes.h"
#include "precision/policy.h"
#include "train/batch.h"
#include "train/device.h"

namespace loom {

// The GPU run: the same steps on the CUDA backend, timed with the stream drained.
static Json run_train_bench_device(const TrainBenchOptions& o, Backend& be,
                                   const std::string& device);

Json run_train_bench(const TrainBenchOptions& o) {
  LOOM_CHECK(o.batch > 0 && o.seq > 0 && o.steps > 0 && o.warmup >= 0,
             "batch, seq and steps must be positive");
  LOOM_CHECK(o.peak_tflops >= 0, "--peak-tflops must be >= 0, got ", o.peak_tflops);
  const DeviceChoice dev = select_device(o.device, "--device", false);
  if (dev.cuda) return run_train_bench_device(o, *dev.backend, dev.describe);
  set_num_threads(o.threads);
  ModelConfig mc = model_preset(o.preset);
  LOOM_CHECK(o.seq <= mc.max_seq, "--seq ", o.seq, " exceeds the preset's max_seq ", mc.max_seq);
  PrecisionPolicy policy = precision_from_name(o.precision);
  Decoder model(mc, cpu_backend(), recompute_from_name(o.recompute), policy.compute);
  model.params().init(1);
  AdamW optim(model.params(), AdamWConfig{}, policy.compute, cpu_backend());
  // The bf16 policy runs its GEMMs in bf16 where the CPU can (as the trainer does).
  std::unique_ptr<Bf16Gemms> bf16 =
      policy.compute == DType::BF16 ? attach_bf16_gemms(model, /*quiet=*/true) : nullptr;
  // FP8 recipes on the block linears, as the trainer attaches them.
  Config fp8_cfg;
  if (o.fp8 != "none") {
    fp8_cfg.set("precision.fp8_recipe", o.fp8, "--fp8");
    fp8_cfg.set("precision.fp8_format", o.fp8_format, "--fp8-format");
  }
  std::unique_ptr<Fp8Recipes> fp8 = attach_fp8_recipes(fp8_cfg, model, /*quiet=*/true);
  // The 2-byte weights, as the trainer keeps them (FP8 quantises them from the bf16 copy).
  if (bf16) drop_fp32_weights(model);

  Batch b = synthetic_batch(o.batch, o.seq, mc.vocab, 7);
  const double tokens = double(o.batch) * o.seq;
  const double flops = mc.train_flops_per_token(o.seq) * tokens;
  std::vector<double> times, cpu_times;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    double t0 = now_seconds(), c0 = process_cpu_seconds();
    model.params().zero_grad();
    if (bf16) bf16->new_weights();
    if (fp8) fp8->begin_step();
    model.forward_backward(b.input(), static_cast<float>(1.0 / tokens));
    optim.step(1e-4, 1.f);
    if (s >= o.warmup) {
      times.push_back(now_seconds() - t0);
      cpu_times.push_back(process_cpu_seconds() - c0);
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu_times.begin(), cpu_times.end());
  double median = times[times.size() / 2];
  double cpu_median = cpu_times[cpu_times.size() / 2];
  double c0 = process_cpu_seconds(), w0 = now_seconds();
  // The peak of the GEMM path used: sgemm, or the bf16 GEMM probe.
  const bool bf16_path = bf16 != nullptr;
  double peak =
      bf16_path ? measure_bf16_gemm_peak_gflops(o.threads) : measure_sgemm_peak_gflops(o.threads);
  // The sgemm measurement's own CPU time per wall second tells how many cores it really had.
  double sgemm_cores = (process_cpu_seconds() - c0) / (now_seconds() - w0);
  double gflops = flops / median / 1e9;
  double gflops_per_core = flops / cpu_median / 1e9;

  Json j = Json::object();
  j["preset"] = o.preset;
  j["params"] = mc.num_params();
  j["batch"] = o.batch;
  j["seq"] = o.seq;
  j["threads"] = o.threads;
  j["precision"] = o.precision;
  j["recompute"] = o.recompute;
  j["fp8"] = fp8 ? fp8->options().describe() : "none";
  j["step_seconds_median"] = median;
  j["tokens_per_s"] = tokens / median;
  j["gflops"] = gflops;
  j["gemm_path"] = bf16_path ? "bf16 (oneDNN)" : "fp32 sgemm";
  j["gemm_peak_gflops"] = peak;
  j["ratio_to_gemm_peak"] = gflops / peak;
  j["step_cpu_seconds_median"] = cpu_median;
  j["gflops_per_cpu_second"] = gflops_per_core;
  j["sgemm_cores_used"] = sgemm_cores;
  j["load_average_1m"] = load_average();
  j["peak_rss_mb"] = peak_rss_mb();
  j["activation_mb"] = model.activation_bytes() / 1048576.0;
  std::printf("loom bench train: %s (%lld params), batch %d x %d tokens, %d threads, %s\n",
              o.preset.c_str(), static_cast<long long>(mc.num_params()), o.batch, o.seq, o.threads,
              o.precision.c_str());
  if (fp8)
    std::printf("  fp8 recipe:               %s on %zu linears\n",
                fp8->options().describe().c_str(), fp8->names().size());
  std::printf("  step time (median of %d): %.3f s\n", o.steps, median);
  std::printf("  tokens/s:                 %.1f\n", tokens / median);
  std::printf("  achieved:                 %.1f GFLOP/s (6*N*tokens + attention)\n", gflops);
  std::printf("  GEMM path:                %s\n", bf16_path ? "bf16 (oneDNN)" : "fp32 sgemm");
  std::printf("  its peak (measured):      %.1f GFLOP/s\n", peak);
  std::printf("  ratio to that peak:       %.1f%%\n", 100 * gflops / peak);
  std::printf("  activation buffers:       %.0f MiB\n", model.activation_bytes() / 1048576.0);
  std::printf("  per CPU-second:           %.1f GFLOP (step used %.2f CPU-s in %.2f s)\n",
              gflops_per_core, cpu_median, median);
  std::printf("  peak resident memory:     %.0f MiB\n", peak_rss_mb());
  std::printf(
      "  load average (1 min):     %.2f  (figures are reliable only when it is below "
      "the thread count)\n",
      load_average());
  return j;
}

static Json run_train_bench_device(const TrainBenchOptions& o, Backend& be,
                                   const std::string& device) {
  ModelConfig mc = model_preset(o.preset);
  LOOM_CHECK(o.seq <= mc.max_seq, "--seq ", o.seq, " exceeds the preset's max_seq ", mc.max_seq);
  // What `loom train --device cuda` runs: the policy's storage (bf16 activations under bf16),
  // fp32 master weights in AdamW, the GEMMs on the tensor cores of the policy's type (TF32
  // under fp32; Linear widens stored bf16 into the Decoder's device scratch), the head in the
  // Decoder's device-sized chunks (Decoder::head_chunk).
  const PrecisionPolicy policy = precision_from_name(o.precision);
  const std::string math =
      set_gemm_math(be, policy.compute == DType::F32 ? "tf32" : dtype_name(policy.compute));
  Decoder model(mc, be, recompute_from_name(o.recompute), policy.compute);
  model.params().init(1);
  AdamW optim(model.params(), AdamWConfig{}, policy.compute, be);
  // FP8 recipes on the block linears, as the trainer attaches them on a GPU (device_fp8.h).
  Config fp8_cfg;
  Fp8Options fp8_opt;
  std::unique_ptr<DeviceFp8Recipes> fp8;
  if (o.fp8 != "none") {
    fp8_cfg.set("precision.fp8_recipe", o.fp8, "--fp8");
    fp8_cfg.set("precision.fp8_format", o.fp8_format, "--fp8-format");
  }
  if (Fp8Options::from(fp8_cfg, mc.n_layer, &fp8_opt))
    fp8 = attach_device_fp8_recipes(fp8_opt, model, be, 1, o.batch * o.seq, "--fp8: ",
                                    /*quiet=*/true);
  Batch b = synthetic_batch(o.batch, o.seq, mc.vocab, 7);
  const double tokens = double(o.batch) * o.seq;
  const double flops = mc.train_flops_per_token(o.seq) * tokens;
  std::vector<double> times;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    be.sync();
    const double t0 = now_seconds();
    model.params().zero_grad();
    if (fp8) fp8->begin_step();
    model.forward_backward(b.input(), static_cast<float>(1.0 / tokens));
    optim.step(1e-4, 1.f);
    be.sync();  // the step is done when the device is, not when the host has queued it
    if (s >= o.warmup) times.push_back(now_seconds() - t0);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const double gflops = flops / median / 1e9;
  const double peak = o.peak_tflops > 0 ? o.peak_tflops * 1e3 : gpu_bf16_peak_gflops(be);
  Json j = Json::object();
  j["preset"] = o.preset;
  j["params"] = mc.num_params();
  j["batch"] = o.batch;
  j["seq"] = o.seq;
  j["device"] = device;
  j["precision"] = o.precision;
  j["gemm_math"] = math;
  j["recompute"] = o.recompute;
  j["fp8"] = fp8 ? fp8_opt.describe() : "none";
  j["step_seconds_median"] = median;
  j["tokens_per_s"] = tokens / median;
  j["gflops"] = gflops;
  j["peak_bf16_gflops"] = peak;
  if (peak > 0) j["mfu"] = gflops / peak;
  j["activation_mb"] = model.activation_bytes() / 1048576.0;
  j["head_rows"] = model.head_chunk();
  j["load_average_1m"] = load_average();
  std::printf("loom bench train: %s (%lld params), batch %d x %d tokens, %s, %s\n",
              o.preset.c_str(), static_cast<long long>(mc.num_params()), o.batch, o.seq,
              device.c_str(), o.precision.c_str());
  std::printf("  GEMM math:                %s tensor cores, fp32 accumulation (%s storage)\n",
              math.c_str(), dtype_name(policy.compute));
  if (fp8)
    std::printf("  fp8 recipe:               %s on %zu linears\n", fp8_opt.describe().c_str(),
                fp8->size());
  std::printf("  step time (median of %d): %.4f s\n", o.steps, median);
  std::printf("  tokens/s:                 %.1f\n", tokens / median);
  std::printf("  achieved:                 %.1f GFLOP/s (6*N*tokens + attention)\n", gflops);
  if (peak > 0)
    std::printf("  MFU:                      %.1f%% of %.0f TFLOP/s (dense bf16 peak%s)\n",
                100 * gflops / peak, peak / 1e3, o.peak_tflops > 0 ? ", --peak-tflops" : "");
  else
    std::printf("  MFU:                      unknown GPU peak (give --peak-tflops)\n");
  std::printf("  activation buffers:       %.0f MiB (head in chunks of %d rows)\n",
              model.activation_bytes() / 1048576.0, model.head_chunk());
  std::printf("  device memory:\n%s\n", be.memory_report().c_str());
  std::printf("  load average (1 min):     %.2f\n", load_average());
  return j;
}

}  // namespace loom
