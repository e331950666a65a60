// What a training run trains with, assembled from its config: the device, the process groups
// over the world, the Decoder in its layout (tensor, sequence, context, expert and pipeline
// parallelism), LoRA and frozen parameters, the optimizer of the trained parameters
// (DataParallel at ZeRO 0-3, one rank in one process), the pipeline runner, the step engine, the
// precision's GEMM recipes, and DPO's frozen reference. The recipes (pre-training, SFT, DPO)
// and the checkpointer work on it; assemble() is the one place that builds it.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "comm/process_groups.h"
#include "core/config.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "optim/lr_schedule.h"
#include "parallel/data_parallel.h"
#include "parallel/frozen_shards.h"
#include "parallel/pipeline.h"
#include "precision/policy.h"
#include "train/cp_inputs.h"
#include "train/device.h"
#include "train/gemm_recipes.h"
#include "train/host_staging.h"
#include "train/step_engine.h"
#include "train/train_options.h"

namespace loom {

// A frozen copy of the policy in the policy's layout (DPO's reference): the starting weights,
// or a checkpoint's. Under ZeRO-3 it holds this rank's shard of the blocks only, gathered block
// by block (FrozenShards, the same split as the policy's); under a pipeline its own stages run
// forward only with the policy's schedule.
struct FrozenReference {
  std::unique_ptr<Decoder> model;
  std::unique_ptr<parallel::FrozenShards> shards;  // parallel.zero = 3
  std::unique_ptr<parallel::PipelineRunner> pipe;  // parallel.pp > 1
};

struct TrainSetup {
  TrainSetup() = default;
  ~TrainSetup();
  TrainSetup(const TrainSetup&) = delete;
  TrainSetup& operator=(const TrainSetup&) = delete;

  TrainOptions opt;       // train.quiet is set on every rank but 0
  Backend* be = nullptr;  // where the step computes (train.device)
  std::string device;     // its description for the log
  ModelConfig model_cfg;
  PrecisionPolicy policy;
  LrSchedule sched;
  int rank = 0;  // in the world
  int etp = 1;   // parallel.etp: the experts' MLPs split over etp ranks of the TP group
  // One rank holding every whole tensor: one-process checkpoint files (the layout every tool
  // reads); anything else writes one part per rank.
  bool whole = true;
  std::string pp_layout;    // stage split and virtual stages, part of the checkpoint layout
  std::string pp_describe;  // the pipeline's schedule for the log (empty without one)
  std::unique_ptr<HostStaging> staging;  // checkpoint I/O's host copies of `be`'s memory

  std::unique_ptr<Decoder> model;
  std::unique_ptr<Lora> lora;  // LoRA fine-tuning ([lora] rank > 0): adapters on the model
  // DPO: the frozen reference (under LoRA the base itself, adapters off: none made).
  FrozenReference reference;
  GemmRecipes recipes;
  // The layout: process groups over the world (of one rank in a one-process run).
  std::unique_ptr<comm::ProcessGroups> pg;
  std::unique_ptr<comm::Communicator> edp_cp;  // expert-data x context parallel (cp > 1)
  // On a device, each process group that moves device memory (DP's gradients, TP's and SP's
  // activations, the CP ring, the EP all-to-all, pipeline activations) as a device communicator
  // (train/device.h: NCCL, or staged through the host), keyed by its host group; scalar
  // reductions stay on the host groups. Declared before dp and pipe: destroyed after.
  DeviceComm device_comm = DeviceComm::Auto;  // parallel.device_comm
  std::map<const comm::Communicator*, std::unique_ptr<comm::Communicator>> device_comms;
  // Every run's optimizer of the trained parameters (the model's, or LoRA's adapters).
  std::unique_ptr<parallel::DataParallel> dp;
  std::unique_ptr<StepEngine> engine;  // every step's gradients, norm, clip and update
  // LoRA with parallel.zero = 3: the frozen base sharded over DP, gathered block by block.
  std::unique_ptr<parallel::FrozenShards> base_shards;
  std::unique_ptr<parallel::PipelineRunner> pipe;  // parallel.pp > 1 (or virtual stages)
  std::unique_ptr<CpInputs> inputs;                // each micro-batch's share of this rank

  // `host` itself on a host-accessible backend, else its device communicator (made once, of
  // `kind`, parallel.device_comm when Auto).
  comm::Communicator& on_device(comm::Communicator& host, DeviceComm kind = DeviceComm::Auto);
  ParamSet& trained_params();  // what the optimizer steps: the adapters under LoRA
  const ParamSet& trained_params() const;
  comm::Communicator& grad_group() const;  // dp, or dp x cp under context parallelism
  std::string layout_name() const;
  // Per-rank checkpoints keep one root per rank: <out_dir>/checkpoints/rank_00003.
  std::string checkpoint_root() const;
  // Micro-batch j of step `step` as the one-process run counts its micro-batches (the data
  // sources deal rank r of dp the one-process micro-batch j * dp + r): LoRA dropout's key, so
  // that its masks do not depend on the layout.
  uint64_t global_micro(int64_t step, size_t j) const;
};

// LoRA dropout on (lora.dropout > 0) for one training micro-batch; off again on exit, errors
// included, so evaluation and forward-only passes never drop.
struct LoraDropoutScope {
  Lora* lora;
  LoraDropoutScope(Lora* l, uint64_t micro, const int32_t* rows = nullptr) : lora(l) {
    if (lora) lora->set_dropout_batch(micro, rows);
  }
  ~LoraDropoutScope() {
    if (lora) lora->clear_dropout();
  }
  LoraDropoutScope(const LoraDropoutScope&) = delete;
  LoraDropoutScope& operator=(const LoraDropoutScope&) = delete;
};

// Builds everything but the data from `cfg` (train.*, [model], [parallel], [precision], [optim],
// [lora]), refusing what a layout or device cannot run before anything is allocated; loads
// train.pretrained's weights and makes DPO's reference. It reads its keys from cfg and leaves
// the check for unknown keys to the caller (which reads the data's and the recipe's first).
// Under a launcher the ranks train one model together; `world` overrides the launcher's world;
// `backend` (tests) overrides train.device and keeps its GEMM math.
std::unique_ptr<TrainSetup> assemble(const Config& cfg, comm::Communicator* world = nullptr,
                                     Backend* backend = nullptr);

// The tokens of the largest forward the linear layers run: a micro-batch's rows (DPO: every
// pair's chosen and rejected sequences, twice train.micro_batch; evaluation batches are the
// same size) of train.seq_len tokens (a CP rank sees part of each: fewer).
int largest_forward_tokens(const TrainOptions& o);

}  // namespace loom
