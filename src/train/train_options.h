// Every key of a config's [train] section, read and checked in one place. The trainer, the data
// sources and the DPO and GRPO recipes take their train.* settings from here.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "model/decoder.h"
#include "train/loss_guard.h"

namespace loom {

struct TrainOptions {
  int64_t steps = 100;
  int micro_batch = 8;
  int seq_len = 128;
  int grad_accum = 1;
  uint64_t seed = 1234;
  int threads = 0;  // 0 = OpenMP default
  int64_t log_interval = 1;
  int64_t eval_interval = 0;  // 0 = never
  int eval_batches = 4;
  std::string out_dir = "runs/default";
  int64_t checkpoint_interval = 0;  // 0 = only at the end
  int keep_last = 3;
  // Checkpoints written by a background thread from a host snapshot while training goes on
  // (ckpt/checkpoint_writer.h); a save waits at most ckpt_timeout seconds for the previous one.
  bool ckpt_async = false;
  double ckpt_timeout = 600;
  bool tensorboard = true;  // metrics also as TensorBoard scalars in <out_dir>/tensorboard
  bool resume = true;       // continue from out_dir/checkpoints/latest when it exists
  // A one-process checkpoint (a step dir or checkpoints root, e.g. `loom ckpt consolidate`'s
  // output) to start from when the run has no checkpoint of its own yet, under any layout.
  std::string init_from;
  // Weights only (Megatron's --pretrained-checkpoint): a checkpoint whose model parameters
  // start this run, at step 0 with a fresh optimizer and data order (fine-tuning). A run's own
  // checkpoint, when it has one, still wins (resume). With LoRA: the frozen base, always.
  std::string pretrained;
  double clip_grad = 1.0;  // global L2 norm; 0 = off
  double peak_gflops = 0;  // MFU denominator; 0 = measure this machine's sgemm peak
  bool quiet = false;
  // pretrain (next-token loss over the data's targets: pre-training and SFT alike) or dpo
  // (data.source = "preference"; [dpo] beta, loss).
  std::string mode = "pretrain";
  // Parameters kept frozen (comma-separated names or name prefixes, e.g. "embed.,blocks.0."):
  // no gradients, no updates, in one process and under every parallel layout.
  std::string freeze;
  // cpu, cuda or auto (cuda when a GPU and a CUDA build are there; train/device.h). On cuda
  // the whole step runs on the device under every layout (DP with ZeRO 0-3 and fp32 or bf16
  // gradient reduction, TP with SP, PP, CP, EP), MoE models, LoRA and DPO; only the fp8 cases
  // precision/device_fp8.h cannot run are refused up front with the reason.
  std::string device = "cpu";
  Recompute recompute = Recompute::None;  // train.recompute: none, selective or full
  // The loss guard (train.on_spike, spike_window, spike_threshold, max_bad_steps,
  // max_rollbacks): loss_guard.h.
  LossGuardOptions guard;
};

// Reads every train.* key (defaults above), refusing impossible values with the key and value.
TrainOptions train_options_from(const Config& c);

}  // namespace loom
