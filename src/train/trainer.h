// The training application: the loop of pre-training, SFT and DPO (run, evaluate, log, guard)
// over what assemble() builds (train/train_setup.h), stepping through the StepEngine and saving
// through the Checkpointer. `loom train` is a thin wrapper around Trainer::run().
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/json.h"
#include "train/batch.h"
#include "train/checkpointer.h"
#include "train/dpo_recipe.h"
#include "train/loss_guard.h"
#include "train/metrics.h"
#include "train/reward_recipe.h"
#include "train/run_lock.h"
#include "train/train_options.h"
#include "train/train_setup.h"

namespace loom {

struct StepResult {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double aux_loss = 0;   // MoE load-balancing loss (already included in loss)
  bool skipped = false;  // fp16 overflow or non-finite gradients
  double seconds = 0;
  // Pipeline parallelism: each pipeline rank's idle fraction in this step (pipeline bubble
  // plus waiting for messages; PipelineRunner::last_idle_fraction), by pipeline rank. Empty
  // without a pipeline.
  std::vector<double> pp_idle;
  // Mode-specific figures for metrics.jsonl and the log (DPO: rewards, margin, accuracy).
  std::vector<std::pair<std::string, double>> extra;
};

class Trainer {
 public:
  // Reads every key it knows from cfg and rejects the rest (unknown keys are errors).
  // Under a launcher (loom launch, mpirun, srun) the ranks train one model together with the
  // layout of [parallel] (docs/parallel.md); `world` overrides the launcher's world (tests pass
  // a one-rank communicator to get a single-process reference inside an MPI job).
  // `backend` (tests: an instrumented CPU backend, a CUDA backend with chosen GEMM math)
  // overrides train.device; its GEMM math is left as it is.
  explicit Trainer(const Config& cfg, comm::Communicator* world = nullptr,
                   Backend* backend = nullptr);
  ~Trainer();

  // Trains until options().steps, saving checkpoints and writing metrics; returns last loss.
  double run();
  StepResult train_step();
  // Mean loss over eval_batches fixed validation batches (DPO: the DPO loss of held-out pairs;
  // last_eval_extra() then holds their reward accuracy and margin).
  double evaluate();
  const std::vector<std::pair<std::string, double>>& last_eval_extra() const { return eval_extra_; }
  DpoRecipe* dpo() { return dpo_.get(); }           // train.mode = "dpo", else nullptr
  RewardRecipe* reward() { return reward_.get(); }  // train.mode = "reward", else nullptr

  void save_checkpoint() { ckpt_->save(); }
  // Waits until the last checkpoint is durable and committed (run() does this at its end; a
  // trainer destroyed without it still waits for the write, but a distributed run's last step
  // then lacks its global commit record and resumes from the one before).
  void finish_checkpoints() { ckpt_->finish(); }
  // Seconds the last save_checkpoint() held up training (the snapshot when asynchronous).
  double last_checkpoint_stall() const { return ckpt_->last_stall(); }
  // A step dir or a checkpoints root.
  bool resume_from(const std::string& path) { return ckpt_->resume_from(path); }

  Decoder& model() { return *s_->model; }
  Lora* lora() { return s_->lora.get(); }
  const TrainOptions& options() const { return s_->opt; }
  int64_t step() const { return step_; }
  int rollbacks() const { return rollbacks_; }  // loss-guard rollbacks in this process
  // Per-rank checkpoints keep one root per rank: <out_dir>/checkpoints/rank_00003.
  std::string checkpoint_root() const { return s_->checkpoint_root(); }
  // Whether this run's layout is more than one process holding every whole tensor (several
  // ranks, ZeRO >= 1, virtual pipeline stages): its checkpoints are then per-rank parts. Every
  // run trains through the same engine (data_parallel()), one process over a one-rank world.
  bool distributed() const { return !s_->whole; }
  TrainSetup& setup() { return *s_; }
  comm::ProcessGroups* groups() { return s_->pg.get(); }
  parallel::DataParallel* data_parallel() { return s_->dp.get(); }
  parallel::FrozenShards* base_shards() { return s_->base_shards.get(); }  // LoRA at ZeRO-3
  parallel::PipelineRunner* pipeline() { return s_->pipe.get(); }  // null unless parallel.pp > 1
  const PrecisionPolicy& precision() const { return s_->policy; }
  // nullptr without precision.fp8_recipe
  Fp8Recipes* fp8_recipes() const { return s_->recipes.fp8.get(); }
  // The GPU's fp8 recipe (train.device = "cuda" with precision.fp8_recipe), else nullptr.
  DeviceFp8Recipes* device_fp8_recipes() const { return s_->recipes.device_fp8.get(); }
  const LossScaler& loss_scaler() const { return s_->engine->scaler(); }
  // For tests: multiply every gradient by this before the overflow check (forces inf).
  void inject_gradient_factor(float f) { inject_ = f; }

 private:
  void log_step(const StepResult& r, int64_t tokens);
  double run_loop();
  StepResult dpo_step();
  StepResult reward_step();
  // The step's end through the engine (StepEngine::step): the loss over `valid` targets, the
  // norm, clip and optimizer step on gradients carrying the loss scale `scale`.
  void finish_step(StepResult& r, double loss_sum, int64_t valid, double scale);
  double pipeline_eval_sum(int64_t& valid);  // evaluate() under pipeline parallelism
  // The loss guard's verdict on a finished step (trainer_guard.cpp): warns, throws (stop), or
  // rolls back to the last good checkpoint and returns true.
  bool guard_step(const StepResult& r);
  void roll_back(const std::string& why);

  Config cfg_;
  double setup_start_ = 0;
  std::unique_ptr<TrainSetup> s_;
  TrainOptions& opt_;  // s_->opt
  std::unique_ptr<DpoRecipe> dpo_;
  std::unique_ptr<RewardRecipe> reward_;
  std::unique_ptr<BatchSource> train_data_, valid_data_;
  Json valid_start_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<RunLock> run_lock_;  // rank 0's, on train.out_dir
  std::unique_ptr<MetricsLog> metrics_;
  std::vector<Batch> micro_;
  std::vector<std::pair<std::string, double>> eval_extra_;
  int64_t step_ = 0;
  double flops_per_token_ = 0;
  double peak_gflops_ = 0;
  double started_ = 0;
  int64_t steps_this_run_ = 0;
  float inject_ = 1.f;
  std::unique_ptr<LossGuard> guard_;  // train.on_spike, train.max_bad_steps
  int rollbacks_ = 0;                 // this process's rollbacks (train.max_rollbacks)
};

}  // namespace loom
