#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>

#include "comm/process_groups.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "kernels/cpu/sgemm_peak.h"
#include "resil/heartbeat.h"
#include "train/data_source.h"
#include "train/frozen_reference.h"

namespace loom {
namespace {

// LOOM_FAULT_INJECT=<rank>:<step>[:error] kills that rank (SIGKILL), or makes it throw, when
// it starts that step: the failure tests check that the job ends with a message naming the
// rank instead of hanging.
void maybe_inject_fault(int rank, int64_t step) {
  const char* f = std::getenv("LOOM_FAULT_INJECT");
  if (!f) return;
  int r = -1;
  long long s = -1;
  char mode[16] = "";
  int n = std::sscanf(f, "%d:%lld:%15s", &r, &s, mode);
  if (n < 2 || r != rank || s != step) return;
  if (std::string(mode) == "error") fail("injected fault at step ", step);
  std::raise(SIGKILL);
}

}  // namespace

Trainer::Trainer(const Config& cfg, comm::Communicator* world, Backend* backend)
    : cfg_(cfg),
      setup_start_(now_seconds()),  // the supervisor's restart-time breakdown
      s_(assemble(cfg_, world, backend)),
      opt_(s_->opt) {
  const std::string config_text = cfg_.dump();
  guard_ = std::make_unique<LossGuard>(opt_.guard);
  if (opt_.eval_interval > 0) {  // every data-parallel rank evaluates the same batches
    valid_data_ = make_batch_source(cfg_, opt_, s_->model_cfg, "valid");
    valid_start_ = valid_data_->state();
  }
  train_data_ = make_batch_source(cfg_, opt_, s_->model_cfg, "train", s_->pg->dp().rank(),
                                  s_->pg->dp().size());
  if (opt_.mode == "dpo") dpo_ = std::make_unique<DpoRecipe>(*s_, dpo_options_from(cfg_));
  if (opt_.mode == "reward") reward_ = std::make_unique<RewardRecipe>(*s_);
  if (opt_.mode == "sft") {
    const std::string source = cfg_.get_string("data.source", "text");
    LOOM_CHECK(source == "chat" || source == "chat_tokens",
               "train.mode = \"sft\" needs data.source = \"chat\" or \"chat_tokens\"");
  }
  cfg_.check_all_used();
  LOOM_CHECK(train_data_->vocab() <= s_->model_cfg.vocab, "the data's vocabulary (",
             train_data_->vocab(), ") exceeds model.vocab (", s_->model_cfg.vocab, ")");
  ckpt_ = std::make_unique<Checkpointer>(*s_, *train_data_, step_, config_text);
  micro_.resize(opt_.grad_accum);
  flops_per_token_ = s_->model_cfg.train_flops_per_token(opt_.seq_len);

  make_dirs(opt_.out_dir);
  if (s_->rank == 0) run_lock_ = lock_run_dir(opt_.out_dir);  // before anything there is read
  const double restore_start = now_seconds();
  const bool resumed = opt_.resume && ckpt_->resume();
  if (!resumed && !opt_.init_from.empty()) ckpt_->start_from(opt_.init_from);
  reference_from_init_weights(*s_, resumed);
  const double restore_seconds = now_seconds() - restore_start;
  if (s_->rank == 0) {  // one metrics log and config per run, written by rank 0
    metrics_ = std::make_unique<MetricsLog>(opt_.out_dir + "/metrics.jsonl", resumed,
                                            opt_.tensorboard ? opt_.out_dir + "/tensorboard" : "",
                                            resumed ? step_ : -1);
    write_file_atomic(opt_.out_dir + "/config.toml", config_text);
  }

  // MFU's denominator: train.peak_gflops, else on a GPU its dense bf16 tensor-core peak, on
  // the CPU this machine's measured sgemm peak.
  const double gpu_peak = s_->be->host_accessible() ? 0.0 : gpu_bf16_peak_gflops(*s_->be);
  peak_gflops_ = opt_.peak_gflops > 0        ? opt_.peak_gflops
                 : s_->rank != 0             ? 1.0  // only rank 0 reports MFU
                 : gpu_peak > 0              ? gpu_peak
                 : s_->be->host_accessible() ? measure_sgemm_peak_gflops(num_threads())
                                             : 1.0;  // an unknown GPU: train.peak_gflops sets it
  if (!opt_.quiet) {
    log_info("model ", s_->model_cfg.name, ": ", s_->model_cfg.fingerprint(), ", ",
             s_->model_cfg.num_params(), " parameters, ", flops_per_token_ / 1e6, " MFLOP/token");
    log_info("data: ", train_data_->describe());
    if (!s_->whole)
      log_info("parallel: ", s_->pg->describe(), ", ZeRO-", s_->dp->zero(), ", ",
               s_->dp->num_buckets(), " gradient buckets");
    if (s_->pipe) log_info(s_->pp_describe);
    if (!opt_.pretrained.empty()) log_info("pretrained weights: ", opt_.pretrained);
    if (s_->lora)
      log_info(s_->lora->config().describe(), ": ", s_->lora->target_names().size(), " adapters, ",
               s_->lora->params().total(), " trainable parameters (base frozen)");
    log_info("device ", s_->device, ", precision ", s_->policy.name, ", recompute ",
             recompute_name(opt_.recompute), ", ", num_threads(), " threads, MFU against ",
             peak_gflops_, " GFLOP/s (",
             opt_.peak_gflops > 0        ? "train.peak_gflops"
             : gpu_peak > 0              ? "the GPU's dense bf16 peak"
             : s_->be->host_accessible() ? "measured sgemm peak"
                                         : "unknown GPU: set train.peak_gflops",
             ")");
  }
  resil::heartbeat_start(s_->rank, s_->pg->world().size(), opt_.out_dir,  // if supervised
                         now_seconds() - setup_start_, restore_seconds);
}

Trainer::~Trainer() = default;

StepResult Trainer::train_step() {
  maybe_inject_fault(s_->rank, step_);
  resil::heartbeat_section(resil::Section::Data, step_ + 1);
  s_->recipes.begin_step();  // stepped (or loaded) since the last use
  if (opt_.mode == "dpo") return dpo_step();
  if (opt_.mode == "reward") return reward_step();
  double t0 = now_seconds();
  StepResult r;
  r.step = step_;
  r.lr = s_->sched.at(step_);
  // Gather the step's micro-batches first: the loss is a mean over every target token of the
  // global batch, so each token's gradient weight needs their total (over all DP ranks).
  int64_t valid = 0;
  for (auto& b : micro_) {
    train_data_->next(b);
    valid += b.valid_targets();
  }
  resil::heartbeat_section(resil::Section::ForwardBackward, step_ + 1);
  valid = s_->pg->dp().all_reduce_scalar(valid, comm::ReduceOp::Sum);
  LOOM_CHECK(valid > 0, "a global batch without any target token");
  const double scale = s_->engine->loss_scale();
  double loss_sum = 0, aux_sum = 0;
  if (s_->pipe) {
    // The pipeline accumulates every micro-batch's gradients, then one DP reduction.
    std::vector<ModelInput> in;
    // Under CP each stage runs ring attention over its CP group on the rank's rows; the
    // activations passed between stages are those rows (pp peers share the cp coordinate).
    for (auto& b : micro_) in.push_back(s_->inputs->of(b));
    s_->engine->accumulate(1, [&](int) {
      // LoRA dropout keyed by the micro-batch each forward or backward (which recomputes the
      // chunk) computes, in whatever order the schedule runs them.
      LoraDropoutScope drop(s_->lora.get(), 0);
      if (s_->lora)
        s_->pipe->before_micro = [this, &in](int mb) {
          s_->lora->set_dropout_batch(s_->global_micro(step_, size_t(mb)),
                                      s_->inputs->rows(in[size_t(mb)]));
        };
      loss_sum = s_->pipe->run(in, static_cast<float>(scale / valid));
      s_->pipe->before_micro = nullptr;
      aux_sum = s_->pipe->last_aux_loss();
    });
    // The loss lives on the last stage (aux losses on the stages holding MoE layers): summing
    // over the pipeline gives every rank the loss, rank 0 included, which logs it.
    loss_sum = s_->pg->pp().all_reduce_scalar(loss_sum, comm::ReduceOp::Sum);
    if (s_->model_cfg.is_moe())
      aux_sum = s_->pg->pp().all_reduce_scalar(aux_sum, comm::ReduceOp::Sum);
    std::vector<float> idle(size_t(s_->pg->pp().size()), 0.f);
    idle[size_t(s_->pg->pp().rank())] = static_cast<float>(s_->pipe->last_idle_fraction());
    s_->pg->pp().all_reduce(idle.data(), int64_t(idle.size()), DType::F32, comm::ReduceOp::Sum);
    r.pp_idle.assign(idle.begin(), idle.end());
  } else {
    s_->engine->accumulate(static_cast<int>(micro_.size()), [&](int j) {
      const ModelInput in = s_->inputs->of(micro_[size_t(j)]);
      LoraDropoutScope drop(s_->lora.get(), s_->global_micro(step_, size_t(j)),
                            s_->inputs->rows(in));
      loss_sum += s_->model->forward_backward(in, static_cast<float>(scale / valid));
      aux_sum += s_->model->last_aux_loss();
    });
  }
  if (inject_ != 1.f) {
    // (After the reduction: the gradients are in the trained set's buffer at ZeRO-0 only.)
    LOOM_CHECK(s_->pg->world().size() == 1 && s_->dp->zero() == 0,
               "inject_gradient_factor is for one-process tests at parallel.zero = 0");
    ParamSet& T = s_->trained_params();
    s_->be->scale_inplace(T.grad(), inject_, T.total());
  }
  // Under CP each rank holds the loss (and aux losses) of its share of the tokens: sum over
  // dp x cp. Tensor-parallel ranks of one DP group hold the same loss.
  loss_sum = s_->grad_group().all_reduce_scalar(loss_sum, comm::ReduceOp::Sum);
  if (s_->model_cfg.is_moe())
    aux_sum = s_->grad_group().all_reduce_scalar(aux_sum, comm::ReduceOp::Sum);
  r.aux_loss = aux_sum / valid;
  finish_step(r, loss_sum, valid, scale);
  r.seconds = now_seconds() - t0;
  return r;
}

void Trainer::finish_step(StepResult& r, double loss_sum, int64_t valid, double scale) {
  resil::heartbeat_section(resil::Section::Optimizer, step_ + 1);
  r.loss = loss_sum / valid;
  const StepEngine::Update u = s_->engine->step(r.lr, scale, step_);
  r.grad_norm = u.grad_norm;
  r.skipped = u.skipped;
  ++step_;
}

double Trainer::evaluate() {
  s_->recipes.new_weights();
  GemmRecipes::Evaluating evaluating(s_->recipes);  // amaxes stay out of the training history
  LOOM_CHECK(valid_data_, "evaluation needs train.eval_interval > 0");
  valid_data_->restore(valid_start_);  // the same validation batches every time
  double sum = 0;
  int64_t n = 0;
  if (opt_.mode == "reward") {
    const RewardRecipe::Stats total = reward_->evaluate(*valid_data_, opt_.eval_batches);
    eval_extra_ = total.report("valid_");
    return total.loss / double(std::max<int64_t>(1, total.pairs));
  }
  if (opt_.mode == "dpo") {
    const DpoRecipe::Stats total = dpo_->evaluate(*valid_data_, opt_.eval_batches);
    eval_extra_ = total.report(dpo_->loss(), "valid_");
    return total.loss / double(std::max<int64_t>(1, total.pairs));
  }
  if (s_->pipe) {
    sum = pipeline_eval_sum(n);
  } else {
    Batch b;
    for (int i = 0; i < opt_.eval_batches; ++i) {
      valid_data_->next(b);
      sum += s_->model->forward_loss(s_->inputs->of(b));
      n += b.valid_targets();
    }
  }
  // Every DP rank evaluates the same batches, so no DP reduction. Under CP each rank's loss
  // covers its share of the tokens.
  if (s_->pg->cp().size() > 1) sum = s_->pg->cp().all_reduce_scalar(sum, comm::ReduceOp::Sum);
  return sum / std::max<int64_t>(1, n);
}

// The validation loss sum under pipeline parallelism: the eval batches run forward only through
// the stages (PipelineRunner::forward_only); the head loss lives on the last stage and MoE aux
// losses on the stages holding their layers, so the sum over the pipeline is every rank's.
// Adds the batches' target tokens to `valid`.
double Trainer::pipeline_eval_sum(int64_t& valid) {
  std::vector<Batch> batches(size_t(std::max(0, opt_.eval_batches)));
  for (auto& b : batches) {
    valid_data_->next(b);
    valid += b.valid_targets();
  }
  std::vector<ModelInput> in;
  for (const auto& b : batches) in.push_back(s_->inputs->of(b));
  const double sum = s_->pipe->forward_only(in);
  for (const auto& b : batches) s_->inputs->forget(b);  // these batches die here
  return s_->pg->pp().all_reduce_scalar(sum, comm::ReduceOp::Sum);
}

void Trainer::log_step(const StepResult& r, int64_t tokens) {
  double tps = tokens / r.seconds;
  // Per rank: the model's FLOPs are split over every rank of the job, and MFU compares one
  // rank's share with one rank's peak.
  const int ranks = s_->pg->world().size();
  double gflops = flops_per_token_ * tps / ranks / 1e9;
  Json j = Json::object();
  j["step"] = r.step + 1;
  j["loss"] = r.loss;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  if (s_->model_cfg.is_moe()) j["aux_loss"] = r.aux_loss;
  j["tokens_per_s"] = tps;
  j["gflops"] = gflops;
  j["mfu"] = gflops / peak_gflops_;
  j["step_seconds"] = r.seconds;
  if (s_->engine->loss_scaling()) j["loss_scale"] = s_->engine->scaler().scale();
  if (r.skipped) j["skipped"] = true;
  for (const auto& [k, v] : r.extra) j[k] = v;
  double bubble = 0;
  if (!r.pp_idle.empty()) {
    Json idle = Json::array();
    for (double f : r.pp_idle) {
      idle.push_back(f);
      bubble += f / r.pp_idle.size();
    }
    j["pp_idle"] = idle;  // per pipeline rank
    j["pp_bubble"] = bubble;
  }
  if (metrics_) metrics_->write(j);
  ++steps_this_run_;
  if (opt_.quiet || ((r.step + 1) % opt_.log_interval != 0 && r.step + 1 != opt_.steps)) return;
  double elapsed = now_seconds() - started_;
  double eta = elapsed / steps_this_run_ * (opt_.steps - r.step - 1);
  char buf[640], aux[48] = "";
  if (s_->model_cfg.is_moe()) std::snprintf(aux, sizeof aux, " (aux %.4f)", r.aux_loss);
  std::string pp_info;
  if (!r.pp_idle.empty()) {
    pp_info =
        cat(" | bubble ", static_cast<int>(std::lround(100 * bubble)), "% (idle per stage rank");
    for (double f : r.pp_idle) pp_info += cat(" ", static_cast<int>(std::lround(100 * f)), "%");
    pp_info += ")";
  }
  for (const auto& [k, v] : r.extra) pp_info += cat(" | ", k, " ", std::lround(v * 1000) / 1000.0);
  std::snprintf(buf, sizeof buf,
                "step %6lld/%lld | loss %.4f%s | lr %.2e | grad norm %.3f | %.0f tok/s | "
                "%.1f GFLOP/s | MFU %.1f%% | ETA %.0fs%s%s",
                static_cast<long long>(r.step + 1), static_cast<long long>(opt_.steps), r.loss, aux,
                r.lr, r.grad_norm, tps, gflops, 100 * gflops / peak_gflops_, eta,
                r.skipped ? " | skipped" : "", pp_info.c_str());
  log_info(buf);
}

double Trainer::run() {
  if (s_->pg->world().size() > 1) {
    // One rank failing must end the whole job (with its rank named), not leave the others
    // waiting in a collective.
    try {
      return run_loop();
    } catch (const std::exception& e) {
      comm::abort_job(e.what());
    }
  }
  return run_loop();
}

double Trainer::run_loop() {
  started_ = now_seconds();
  const int64_t tokens =
      int64_t(opt_.micro_batch) * opt_.seq_len * opt_.grad_accum * (s_->pg->dp().size());
  if (step_ >= opt_.steps && !opt_.quiet)
    log_info("already at step ", step_, " of ", opt_.steps, ": nothing to do");
  double last = NAN;
  while (step_ < opt_.steps) {
    StepResult r = train_step();
    resil::heartbeat_step_done(step_);
    r.loss = guard_->apply_test_spike(step_, r.loss);
    last = r.loss;
    log_step(r, tokens);
    if (guard_step(r)) continue;  // rolled back to the last checkpoint: no eval, no save
    if (opt_.eval_interval > 0 && (step_ % opt_.eval_interval == 0 || step_ == opt_.steps)) {
      resil::heartbeat_section(resil::Section::Eval, step_);
      double vl = evaluate();
      Json j = Json::object();
      j["step"] = step_;
      j["valid_loss"] = vl;
      std::string more;
      for (const auto& [k, v] : eval_extra_) {
        j[k] = v;
        more += cat(" | ", k, " ", v);
      }
      if (metrics_) metrics_->write(j);
      if (!opt_.quiet) log_info("step ", step_, " | validation loss ", vl, more);
    }
    bool at_interval = opt_.checkpoint_interval > 0 && step_ % opt_.checkpoint_interval == 0;
    if (at_interval || step_ == opt_.steps) save_checkpoint();
  }
  finish_checkpoints();
  return last;
}

StepResult Trainer::dpo_step() {
  const double t0 = now_seconds();
  StepResult r;
  r.step = step_;
  r.lr = s_->sched.at(step_);
  const DpoRecipe::Stats total = dpo_->gradients(micro_, *train_data_, step_);
  r.extra = total.report(dpo_->loss(), "");
  finish_step(r, total.loss, total.pairs, 1.0);
  r.seconds = now_seconds() - t0;
  return r;
}

StepResult Trainer::reward_step() {
  const double t0 = now_seconds();
  StepResult r;
  r.step = step_;
  r.lr = s_->sched.at(step_);
  const RewardRecipe::Stats total = reward_->gradients(micro_, *train_data_, step_);
  r.extra = total.report("");
  finish_step(r, total.loss, total.pairs, 1.0);
  r.seconds = now_seconds() - t0;
  return r;
}

}  // namespace loom
