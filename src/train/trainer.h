// The training application: model + optimizer + schedule + precision + data + checkpoints +
// metrics, driven by a config. `loom train` is a thin wrapper around Trainer::run().
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/safetensors.h"
#include "core/config.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"
#include "parallel/frozen_shards.h"
#include "parallel/pipeline.h"
#include "precision/bf16_gemms.h"
#include "precision/device_fp8.h"
#include "precision/fp8_recipes.h"
#include "precision/policy.h"
#include "train/batch.h"
#include "train/device.h"
#include "train/dpo.h"
#include "train/loss_guard.h"
#include "train/metrics.h"
#include "train/run_lock.h"

namespace loom {

namespace comm {
class Communicator;
class ProcessGroups;
struct ParallelDims;
}  // namespace comm

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
  // the whole step runs on the device: one process, or data parallelism at ZeRO 0-3 over
  // NCCL (fp32 or bf16 gradient reduction), MoE models, LoRA and DPO; what does not run there
  // yet (CP, EP, TP/PP) is refused up front with the reason. The FP8 recipes run
  // on CUDA as far as precision/device_fp8.h says.
  std::string device = "cpu";
  // Guard: this many consecutive skipped steps (non-finite gradients) stop the run with an error
  // (or roll it back, train.on_spike = "rollback"), before a checkpoint of bad weights could
  // rotate good ones away. 0 = off. The loss-spike keys are LossGuardOptions (loss_guard.h).
  int max_bad_steps = 10;
};

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
  // DPO on one micro-batch of pairs: the pairs' DPO losses (summed) and statistics; with
  // `backward`, the policy's gradients of the loss scaled by 1 / pairs_in_step.
  struct DpoStats {
    double loss = 0, reward_chosen = 0, reward_rejected = 0, correct = 0;
    int64_t pairs = 0;
  };
  float dpo_aux_weight(const ModelInput& in) const;
  DpoStats dpo_micro(const Batch& b, bool backward, int64_t pairs_in_step);
  // The same for a pipeline's micro-batches together (every pipeline rank; the figures summed
  // over the pipeline).
  DpoStats dpo_pipeline(std::vector<Batch>& batches, bool backward, int64_t pairs_in_step);

  void save_checkpoint();
  // Waits until the last checkpoint is durable and committed (run() does this at its end; a
  // trainer destroyed without it still waits for the write, but a distributed run's last step
  // then lacks its global commit record and resumes from the one before).
  void finish_checkpoints();
  // Seconds the last save_checkpoint() held up training (the snapshot when asynchronous).
  double last_checkpoint_stall() const;
  bool resume_from(const std::string& path);  // a step dir or a checkpoints root

  Decoder& model() { return *model_; }
  Lora* lora() { return lora_.get(); }
  const TrainOptions& options() const { return opt_; }
  int64_t step() const { return step_; }
  int rollbacks() const { return rollbacks_; }  // loss-guard rollbacks in this process
  // Per-rank checkpoints keep one root per rank: <out_dir>/checkpoints/rank_00003.
  std::string checkpoint_root() const;
  // Whether this run's layout is more than one process holding every whole tensor (several
  // ranks, ZeRO >= 1, virtual pipeline stages): its checkpoints are then per-rank parts. Every
  // run trains through the same engine (data_parallel()), one process over a one-rank world.
  bool distributed() const { return !whole_; }
  comm::ProcessGroups* groups() { return pg_.get(); }
  parallel::DataParallel* data_parallel() { return dp_.get(); }
  parallel::FrozenShards* base_shards() { return base_shards_.get(); }  // LoRA at ZeRO-3
  parallel::PipelineRunner* pipeline() { return pipe_.get(); }  // null unless parallel.pp > 1
  const PrecisionPolicy& precision() const { return policy_; }
  Fp8Recipes* fp8_recipes() const { return fp8_.get(); }  // nullptr without precision.fp8_recipe
  // The GPU's fp8 recipe (train.device = "cuda" with precision.fp8_recipe), else nullptr.
  DeviceFp8Recipes* device_fp8_recipes() const { return device_fp8_.get(); }
  const LossScaler& loss_scaler() const { return scaler_; }
  // For tests: multiply every gradient by this before the overflow check (forces inf).
  void inject_gradient_factor(float f) { inject_ = f; }

 private:
  void log_step(const StepResult& r, int64_t tokens);
  double run_loop();
  // The one gradient path (trainer.cpp), the engine's: dp_->start_step, then per micro-batch
  // dp_->start_micro, the model's forward_backward, dp_->finish_micro; grad_sq() is then the
  // squared global gradient norm and finish_step checks it (non-finite: skipped; fp16: the
  // loss scaler), clips, and steps.
  double grad_sq();
  void finish_step(StepResult& r, double loss_sum, int64_t valid, double sq, double scale);
  ckpt::TrainerState checkpoint_state(int64_t optimizer_steps) const;
  int64_t restore_state(const ckpt::Checkpoint& c, bool same_layout = true);
  void restore(const ckpt::Checkpoint& c);
  void commit_distributed();
  ckpt::TensorList shard_list(const std::vector<StateSlice>& s) const;
  ckpt::TensorList stage(ckpt::TensorList views);  // host copies of device tensors (see .cpp)
  void unstage();                                  // ... uploaded back after they were filled
  void check_device_support(int world_size, int cp, const Fp8Options* fp8) const;
  ckpt::TensorList optim_list() const;
  bool resume_distributed();
  bool resume_across_layouts();  // trainer_layout_resume.cpp
  void start_from_one_process(const std::string& path);
  void load_pretrained(const std::string& path);
  void reference_from_init_weights(bool resumed);  // DPO: see trainer.cpp
  void make_reference(const ckpt::Checkpoint* from);
  StepResult dpo_step();
  DpoStats dpo_terms(const ModelInput& in, const StepOutputs& ref, const StepOutputs& pol,
                     int64_t pairs_in_step, std::vector<float>& w) const;
  ParamSet& trained_params();  // what the optimizer steps: the adapters under LoRA
  // Micro-batch j of this step as the one-process run counts its micro-batches (the data
  // sources deal rank r of dp the one-process micro-batch j * dp + r): LoRA dropout's key, so
  // that its masks do not depend on the layout.
  uint64_t global_micro(size_t j) const;
  // Under context parallelism, the micro-batch row of each of this rank's rows of `in` (LoRA
  // dropout draws a token's mask by its micro-batch row); nullptr otherwise.
  const int32_t* cp_rows(const ModelInput& in) const;
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
  void check_same_global_batch(const ckpt::Checkpoint& c) const;
  std::string layout_name() const;
  comm::Communicator& grad_group() const;  // dp, or dp x cp under context parallelism
  ModelInput model_input(const Batch& b);
  double pipeline_eval_sum(int64_t& valid);  // evaluate() under pipeline parallelism
  // The loss guard's verdict on a finished step (trainer_guard.cpp): warns, throws (stop), or
  // rolls back to the last good checkpoint and returns true.
  bool guard_step(const StepResult& r);
  void roll_back(const std::string& why);

  Config cfg_;
  std::string config_text_;
  Backend* be_ = nullptr;                          // where the step computes (train.device)
  std::string device_;                             // its description for the log
  std::vector<std::pair<float*, Tensor>> staged_;  // stage(): device address, host copy
  TrainOptions opt_;
  ModelConfig mcfg_;
  PrecisionPolicy policy_;
  LossScaler scaler_;
  LrSchedule sched_;
  std::unique_ptr<Decoder> model_;
  std::unique_ptr<Lora> lora_;  // LoRA fine-tuning ([lora] rank > 0): adapters on the model
  // DPO: the frozen reference (the starting weights; under LoRA the base itself, adapters off).
  std::unique_ptr<Decoder> reference_;
  // Full DPO with parallel.zero = 3: the reference sharded like the policy (after reference_:
  // destroyed first).
  std::unique_ptr<parallel::FrozenShards> reference_shards_;
  std::unique_ptr<parallel::PipelineRunner> reference_pipe_;  // DPO under PP: the reference's
  std::unique_ptr<Bf16Gemms> bf16_gemms_;                     // bf16 policy on an AVX512-BF16 CPU
  std::unique_ptr<Fp8Recipes> fp8_;               // precision.fp8_recipe: FP8 / MXFP8 GEMMs
  std::unique_ptr<DeviceFp8Recipes> device_fp8_;  // ... the same on a GPU
  double dpo_beta_ = 0.1;
  DpoLoss dpo_loss_ = DpoLoss::Sigmoid;
  std::vector<std::pair<std::string, double>> eval_extra_;
  std::unique_ptr<BatchSource> train_data_, valid_data_;
  Json valid_start_;
  std::unique_ptr<RunLock> run_lock_;  // rank 0's, on train.out_dir
  std::unique_ptr<MetricsLog> metrics_;
  std::vector<Batch> micro_;
  int64_t step_ = 0;
  double flops_per_token_ = 0;
  double peak_gflops_ = 0;
  double started_ = 0;
  int64_t steps_this_run_ = 0;
  float inject_ = 1.f;
  // The layout: process groups over the world (of one rank in a one-process run) and the
  // engine every step goes through, the Optimizer of the trained parameters (the model's, or
  // LoRA's adapters).
  std::unique_ptr<comm::ProcessGroups> pg_;
  std::unique_ptr<comm::Communicator> edp_cp_;  // expert-data x context parallel (cp > 1)
  // On a device, each process group that moves device memory (DP's gradients, TP's and SP's
  // activations, the CP ring, the EP all-to-all, pipeline activations) as a device communicator
  // (train/device.h: NCCL, or staged through the host), keyed by its host group; the trainer's
  // scalar reductions stay on the host groups. Declared before dp_ and pipe_: destroyed after.
  DeviceComm device_comm_ = DeviceComm::Auto;  // parallel.device_comm
  std::map<const comm::Communicator*, std::unique_ptr<comm::Communicator>> device_comms_;
  // `host` itself on a host-accessible backend, else its device communicator (made once, of
  // `kind`, parallel.device_comm when Auto).
  comm::Communicator& on_device(comm::Communicator& host, DeviceComm kind = DeviceComm::Auto);
  std::unique_ptr<parallel::DataParallel> dp_;
  bool whole_ = true;  // one rank holding every whole tensor: one-process checkpoint files
  // LoRA with parallel.zero = 3: the frozen base sharded over DP, gathered block by block.
  bool base_zero3_ = false;
  std::unique_ptr<parallel::FrozenShards> base_shards_;
  std::vector<double> norm_weights_;  // per parameter: counted in the global grad norm
  std::unique_ptr<parallel::PipelineRunner> pipe_;
  struct CpLocal {  // this rank's share of a micro-batch under context parallelism
    CpBatch batch;
    std::vector<int32_t> tokens, targets;
  };
  std::map<const Batch*, CpLocal> cp_local_;
  std::string pp_layout_;  // stage split and virtual stages, part of the checkpoint layout
  int rank_ = 0;
  std::unique_ptr<LossGuard> guard_;  // train.on_spike, train.max_bad_steps
  int rollbacks_ = 0;                 // this process's rollbacks (train.max_rollbacks)
  std::unique_ptr<ckpt::CheckpointWriter> ckpt_writer_;  // made by the first save
};

}  // namespace loom
