// `loom bench train`: training throughput against the machine's sgemm peak.
#include <cstdio>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "train/train_bench.h"

namespace loom::cli {

int run_bench_serve(const Args& args);  // bench_serve_cmd.cpp

int run_bench(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf(
        "usage: loom bench train|serve [options]   (loom bench train --help)\n\n"
        "benchmarks:\n  train   full training steps of a preset vs the sgemm peak\n"
        "  serve   serving latency under a Poisson load; decode vs the bandwidth roofline\n");
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "serve") return run_bench_serve(Args(args.begin() + 1, args.end()));
  LOOM_CHECK(args[0] == "train", "unknown benchmark '", args[0], "' (known: train, serve)");
  Options o("loom bench train [--preset P] [--batch B] [--seq T] [--threads N]",
            "Times full training steps (forward, backward, AdamW) on synthetic tokens and\n"
            "prints tokens/s, achieved GFLOP/s (6*N*tokens + attention) and the ratio to this\n"
            "machine's measured OpenBLAS sgemm peak. The last line is one JSON object.");
  TrainBenchOptions b;
  o.value("preset", b.preset, "model preset")
      .value("batch", std::to_string(b.batch), "sequences per step")
      .value("seq", std::to_string(b.seq), "tokens per sequence")
      .value("threads", std::to_string(b.threads), "threads (OpenMP and BLAS)")
      .value("steps", std::to_string(b.steps), "timed steps (the median is reported)")
      .value("warmup", std::to_string(b.warmup), "untimed steps first")
      .value("precision", b.precision, "fp32, bf16 or fp16")
      .value("recompute", b.recompute, "none, selective or full")
      .value("fp8", b.fp8,
             "FP8 recipe on the block linears: none, fp8_tensorwise_current, "
             "fp8_tensorwise_delayed or mxfp8")
      .value("fp8-format", b.fp8_format, "e4m3 or hybrid (E5M2 gradients)");
  if (!o.parse(Args(args.begin() + 1, args.end()))) return 0;
  b.preset = o.get("preset");
  b.batch = o.get_int32("batch", 1);
  b.seq = o.get_int32("seq", 1);
  b.threads = o.get_int32("threads", 0);
  b.steps = o.get_int32("steps", 1);
  b.warmup = o.get_int32("warmup", 0);
  b.precision = o.get("precision");
  b.recompute = o.get("recompute");
  b.fp8 = o.get("fp8");
  b.fp8_format = o.get("fp8-format");
  Json j = run_train_bench(b);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace loom::cli
