// Fine-tuning benchmark (`loom bench finetune`): LoRA against full fine-tuning of one preset on
// synthetic tokens (step time, CPU seconds per step, peak resident memory, optimizer-state
// bytes, trainable parameters), and supervised fine-tuning throughput on synthetic chat data
// with and without packing (real tokens/s and packing efficiency).
//
// Each configuration runs in its own child process, so that its peak resident memory
// (getrusage's ru_maxrss) is its own and not the largest of all of them.
#pragma once

#include <string>

#include "core/json.h"

namespace loom {

struct FinetuneBenchOptions {
  std::string preset = "gpt2-124m";
  int batch = 4, seq = 64, threads = 1, steps = 3, warmup = 1;
  int lora_rank = 8;
  double lora_alpha = 8;
  std::string lora_targets = "all-linear";
  double lora_dropout = 0;  // > 0: each LoRA step a training micro-batch with this dropout
  bool sft = true;          // also the packed / unpacked SFT throughput
  int sft_examples = 256;   // synthetic conversations for it
  double timeout_s = 3600;  // per child process
};

// Runs the benchmark, prints a readable report, returns the figures.
Json run_finetune_bench(const FinetuneBenchOptions& o);

}  // namespace loom
