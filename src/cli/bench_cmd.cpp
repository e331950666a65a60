// `loom bench train`: training throughput against the machine's sgemm peak; `loom bench
// finetune`: LoRA vs full fine-tuning, and SFT with and without packing.
#include <cstdio>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "train/finetune_bench.h"
#include "train/train_bench.h"

namespace loom::cli {

int run_bench_serve(const Args& args);  // bench_serve_cmd.cpp

// The options of both training benchmarks (TrainBenchOptions, FinetuneBenchOptions): the model,
// the step's shape and threads, and how many steps are timed; defaults from `b`.
template <typename Bench>
static Options& timed_steps_options(Options& o, const Bench& b) {
  return o.value("preset", b.preset, "model preset")
      .value("batch", std::to_string(b.batch), "sequences per step")
      .value("seq", std::to_string(b.seq), "tokens per sequence")
      .value("threads", std::to_string(b.threads), "threads (OpenMP and BLAS)")
      .value("steps", std::to_string(b.steps), "timed steps (the median is reported)")
      .value("warmup", std::to_string(b.warmup), "untimed steps first");
}

// Reads them back; --seq and --threads have the benchmark's own lower bounds.
template <typename Bench>
static void read_timed_steps(const Options& o, Bench& b, int min_seq, int min_threads) {
  b.preset = o.get("preset");
  b.batch = o.get_int32("batch", 1);
  b.seq = o.get_int32("seq", min_seq);
  b.threads = o.get_int32("threads", min_threads, kMaxThreads);
  b.steps = o.get_int32("steps", 1);
  b.warmup = o.get_int32("warmup", 0);
}

static int run_bench_finetune(const Args& args) {
  Options o("loom bench finetune [--preset P] [--batch B] [--seq T] [--threads N] [--lora-rank R]",
            "LoRA against full fine-tuning of a preset on synthetic tokens (fp32): step time, CPU\n"
            "seconds per step, peak resident memory (each run in its own process), optimizer-\n"
            "state bytes; then full-fine-tuning SFT on synthetic chat data with and without\n"
            "packing (real tokens/s, packing efficiency). The last line is one JSON object.");
  FinetuneBenchOptions b;
  timed_steps_options(o, b)
      .value("lora-rank", std::to_string(b.lora_rank), "LoRA rank")
      .value("lora-alpha", "8", "LoRA alpha")
      .value("lora-targets", b.lora_targets, "LoRA targets (all-linear, or names/suffixes)")
      .value("lora-dropout", "0", "LoRA dropout on the adapters' inputs, in [0, 1)")
      .flag("no-sft", "skip the SFT packing measurement")
      .value("sft-examples", std::to_string(b.sft_examples), "synthetic conversations for SFT")
      .value("timeout", "3600", "seconds each measured configuration may take");
  if (!o.parse(args)) return 0;
  read_timed_steps(o, b, 16, 1);
  b.lora_rank = o.get_int32("lora-rank", 1);
  b.lora_alpha = o.get_double("lora-alpha");
  b.lora_targets = o.get("lora-targets");
  b.lora_dropout = o.get_double("lora-dropout");
  LOOM_CHECK(b.lora_dropout >= 0 && b.lora_dropout < 1, "--lora-dropout must lie in [0, 1), got ",
             b.lora_dropout);
  b.sft = !o.has("no-sft");
  b.sft_examples = o.get_int32("sft-examples", 1);
  b.timeout_s = o.get_double("timeout");
  Json j = run_finetune_bench(b);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

int run_bench(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf(
        "usage: loom bench train|serve|finetune [options]   (loom bench train --help)\n\n"
        "benchmarks:\n  train   full training steps of a preset vs the sgemm peak\n"
        "  serve   serving latency under a Poisson load; decode vs the bandwidth roofline\n"
        "  finetune  LoRA vs full fine-tuning; SFT with and without packing\n");
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "serve") return run_bench_serve(Args(args.begin() + 1, args.end()));
  if (args[0] == "finetune") return run_bench_finetune(Args(args.begin() + 1, args.end()));
  LOOM_CHECK(args[0] == "train", "unknown benchmark '", args[0],
             "' (known: train, serve, finetune)");
  Options o("loom bench train [--preset P] [--batch B] [--seq T] [--threads N] [--device D]",
            "Times full training steps (forward, backward, AdamW) on synthetic tokens and\n"
            "prints tokens/s, achieved GFLOP/s (6*N*tokens + attention) and the ratio to this\n"
            "machine's measured OpenBLAS sgemm peak. The last line is one JSON object.");
  TrainBenchOptions b;
  timed_steps_options(o, b)
      .value("precision", b.precision, "fp32, bf16 or fp16")
      .value("recompute", b.recompute, "none, selective or full")
      .value("fp8", b.fp8,
             "FP8 recipe on the block linears: none, fp8_tensorwise_current, "
             "fp8_tensorwise_delayed or mxfp8")
      .value("fp8-format", b.fp8_format, "e4m3 or hybrid (E5M2 gradients)")
      .value("device", b.device,
             "cpu, cuda or auto; on cuda --precision picks the GEMM math (fp32: TF32, bf16) and "
             "MFU is against the GPU's dense bf16 peak")
      .value("peak-tflops", "0", "the GPU's dense bf16 peak for MFU (0: known by its name)");
  if (!o.parse(Args(args.begin() + 1, args.end()))) return 0;
  read_timed_steps(o, b, 1, 0);
  b.precision = o.get("precision");
  b.recompute = o.get("recompute");
  b.fp8 = o.get("fp8");
  b.fp8_format = o.get("fp8-format");
  b.device = o.get("device");
  b.peak_tflops = o.get_double("peak-tflops");
  Json j = run_train_bench(b);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace loom::cli
