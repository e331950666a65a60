#include "train/trainer.h"

#include <cmath>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "kernels/cpu/sgemm_peak.h"
#include "train/data_source.h"

namespace loom {

static TrainOptions train_options_from(const Config& c) {
  TrainOptions o;
  o.steps = c.get_int("train.steps", o.steps);
  o.micro_batch = static_cast<int>(c.get_int("train.micro_batch", o.micro_batch));
  o.seq_len = static_cast<int>(c.get_int("train.seq_len", o.seq_len));
  o.grad_accum = static_cast<int>(c.get_int("train.grad_accum", o.grad_accum));
  o.seed = static_cast<uint64_t>(c.get_int("train.seed", static_cast<int64_t>(o.seed)));
  o.threads = static_cast<int>(c.get_int("train.threads", o.threads));
  o.log_interval = c.get_int("train.log_interval", o.log_interval);
  o.eval_interval = c.get_int("train.eval_interval", o.eval_interval);
  o.eval_batches = static_cast<int>(c.get_int("train.eval_batches", o.eval_batches));
  o.out_dir = c.get_string("train.out_dir", o.out_dir);
  o.checkpoint_interval = c.get_int("train.checkpoint_interval", o.checkpoint_interval);
  o.keep_last = static_cast<int>(c.get_int("train.keep_last", o.keep_last));
  o.resume = c.get_bool("train.resume", o.resume);
  o.clip_grad = c.get_double("train.clip_grad", o.clip_grad);
  o.peak_gflops = c.get_double("train.peak_gflops", o.peak_gflops);
  o.quiet = c.get_bool("train.quiet", o.quiet);
  LOOM_CHECK(o.steps > 0, "train.steps must be positive, got ", o.steps);
  LOOM_CHECK(o.micro_batch > 0, "train.micro_batch must be positive, got ", o.micro_batch);
  LOOM_CHECK(o.seq_len > 0, "train.seq_len must be positive, got ", o.seq_len);
  LOOM_CHECK(o.grad_accum > 0, "train.grad_accum must be positive, got ", o.grad_accum);
  LOOM_CHECK(o.log_interval > 0, "train.log_interval must be positive");
  LOOM_CHECK(o.eval_interval >= 0 && o.checkpoint_interval >= 0,
             "train.eval_interval and train.checkpoint_interval must be >= 0");
  LOOM_CHECK(o.keep_last >= 0, "train.keep_last must be >= 0");
  LOOM_CHECK(o.clip_grad >= 0, "train.clip_grad must be >= 0");
  return o;
}

Trainer::Trainer(const Config& cfg) : cfg_(cfg) {
  config_text_ = cfg_.dump();
  opt_ = train_options_from(cfg_);
  set_num_threads(opt_.threads);
  mcfg_ = model_config_from(cfg_);
  LOOM_CHECK(opt_.seq_len <= mcfg_.max_seq, "train.seq_len (", opt_.seq_len,
             ") exceeds model.max_seq (", mcfg_.max_seq, ")");
  policy_ = precision_from_name(cfg_.get_string("precision.policy", "fp32"));
  if (policy_.loss_scaling) scaler_ = LossScaler(LossScaler::options_from(cfg_));
  sched_ = lr_schedule_from(cfg_, opt_.steps);
  Recompute rc = recompute_from_name(cfg_.get_string("train.recompute", "none"));

  AdamWConfig acfg = adamw_config_from(cfg_);
  train_data_ = make_batch_source(cfg_, opt_, mcfg_, "train");
  if (opt_.eval_interval > 0) {
    valid_data_ = make_batch_source(cfg_, opt_, mcfg_, "valid");
    valid_start_ = valid_data_->state();
  }
  cfg_.check_all_used();
  LOOM_CHECK(train_data_->vocab() <= mcfg_.vocab, "the data's vocabulary (", train_data_->vocab(),
             ") exceeds model.vocab (", mcfg_.vocab, ")");

  model_ = std::make_unique<Decoder>(mcfg_, cpu_backend(), rc, policy_.compute);
  model_->params().init(opt_.seed);
  if (policy_.compute != DType::F32)
    round_to(policy_.compute, model_->params().data(), model_->params().total());
  optim_ = std::make_unique<AdamW>(model_->params(), acfg, policy_.compute, cpu_backend());
  micro_.resize(opt_.grad_accum);
  flops_per_token_ = mcfg_.train_flops_per_token(opt_.seq_len);

  make_dirs(opt_.out_dir);
  bool resumed = opt_.resume && ckpt::find_latest_checkpoint(checkpoint_root()).has_value() &&
                 resume_from(checkpoint_root());
  metrics_ = std::make_unique<MetricsLog>(opt_.out_dir + "/metrics.jsonl", resumed);
  write_file_atomic(opt_.out_dir + "/config.toml", config_text_);

  peak_gflops_ = opt_.peak_gflops > 0 ? opt_.peak_gflops : measure_sgemm_peak_gflops(num_threads());
  if (!opt_.quiet) {
    log_info("model ", mcfg_.name, ": ", mcfg_.fingerprint(), ", ", mcfg_.num_params(),
             " parameters, ", flops_per_token_ / 1e6, " MFLOP/token");
    log_info("data: ", train_data_->describe());
    log_info("precision ", policy_.name, ", recompute ", recompute_name(rc), ", ", num_threads(),
             " threads, MFU against ", peak_gflops_, " GFLOP/s (",
             opt_.peak_gflops > 0 ? "train.peak_gflops" : "measured sgemm peak", ")");
  }
}

Trainer::~Trainer() = default;

StepResult Trainer::train_step() {
  double t0 = now_seconds();
  StepResult r;
  r.step = step_;
  r.lr = sched_.at(step_);
  // Gather the step's micro-batches first: the loss is a mean over every target token of the
  // global batch, so each token's gradient weight needs their total.
  int64_t valid = 0;
  for (auto& b : micro_) {
    train_data_->next(b);
    valid += b.valid_targets();
  }
  LOOM_CHECK(valid > 0, "a global batch without any target token");
  const double scale = policy_.loss_scaling ? scaler_.scale() : 1.0;
  ParamSet& P = model_->params();
  P.zero_grad();
  double loss_sum = 0;
  for (auto& b : micro_)
    loss_sum += model_->forward_backward(b.input(), static_cast<float>(scale / valid));
  r.loss = loss_sum / valid;
  Backend& be = cpu_backend();
  if (inject_ != 1.f) be.scale_inplace(P.grad(), inject_, P.total());

  double sq = be.sum_squares(P.grad(), P.total());
  bool finite = std::isfinite(sq);
  r.grad_norm = std::sqrt(sq) / scale;
  bool proceed = policy_.loss_scaling ? scaler_.update(finite) : finite;
  if (!finite && !policy_.loss_scaling)
    log_warn("step ", step_, ": non-finite gradients; step skipped");
  if (proceed) {
    float grad_scale = static_cast<float>(1.0 / scale);
    if (opt_.clip_grad > 0 && r.grad_norm > opt_.clip_grad)
      grad_scale *= static_cast<float>(opt_.clip_grad / r.grad_norm);
    optim_->step(r.lr, grad_scale);
  }
  r.skipped = !proceed;
  ++step_;
  r.seconds = now_seconds() - t0;
  return r;
}

double Trainer::evaluate() {
  LOOM_CHECK(valid_data_, "evaluation needs train.eval_interval > 0");
  valid_data_->restore(valid_start_);  // the same validation batches every time
  double sum = 0;
  int64_t n = 0;
  Batch b;
  for (int i = 0; i < opt_.eval_batches; ++i) {
    valid_data_->next(b);
    sum += model_->forward_loss(b.input());
    n += b.valid_targets();
  }
  return sum / std::max<int64_t>(1, n);
}

void Trainer::log_step(const StepResult& r, int64_t tokens) {
  double tps = tokens / r.seconds;
  double gflops = flops_per_token_ * tps / 1e9;
  Json j = Json::object();
  j["step"] = r.step + 1;
  j["loss"] = r.loss;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  j["tokens_per_s"] = tps;
  j["gflops"] = gflops;
  j["mfu"] = gflops / peak_gflops_;
  j["step_seconds"] = r.seconds;
  if (policy_.loss_scaling) j["loss_scale"] = scaler_.scale();
  if (r.skipped) j["skipped"] = true;
  metrics_->write(j);
  ++steps_this_run_;
  if (opt_.quiet || ((r.step + 1) % opt_.log_interval != 0 && r.step + 1 != opt_.steps)) return;
  double elapsed = now_seconds() - started_;
  double eta = elapsed / steps_this_run_ * (opt_.steps - r.step - 1);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | "
                "%.1f GFLOP/s | MFU %.1f%% | ETA %.0fs%s",
                static_cast<long long>(r.step + 1), static_cast<long long>(opt_.steps), r.loss,
                r.lr, r.grad_norm, tps, gflops, 100 * gflops / peak_gflops_, eta,
                r.skipped ? " | skipped" : "");
  log_info(buf);
}

double Trainer::run() {
  started_ = now_seconds();
  const int64_t tokens = int64_t(opt_.micro_batch) * opt_.seq_len * opt_.grad_accum;
  if (step_ >= opt_.steps && !opt_.quiet)
    log_info("already at step ", step_, " of ", opt_.steps, ": nothing to do");
  double last = NAN;
  while (step_ < opt_.steps) {
    StepResult r = train_step();
    last = r.loss;
    log_step(r, tokens);
    if (opt_.eval_interval > 0 && (step_ % opt_.eval_interval == 0 || step_ == opt_.steps)) {
      double vl = evaluate();
      Json j = Json::object();
      j["step"] = step_;
      j["valid_loss"] = vl;
      metrics_->write(j);
      if (!opt_.quiet) log_info("step ", step_, " | validation loss ", vl);
    }
    bool at_interval = opt_.checkpoint_interval > 0 && step_ % opt_.checkpoint_interval == 0;
    if (at_interval || step_ == opt_.steps) save_checkpoint();
  }
  return last;
}

void Trainer::save_checkpoint() {
  ckpt::TrainerState st;
  st.step = step_;
  st.seed = opt_.seed;
  st.data = train_data_->state();
  st.config_text = config_text_;
  st.extra["model_fingerprint"] = mcfg_.fingerprint();
  st.extra["optimizer_steps"] = optim_->steps_taken();
  st.extra["precision"] = policy_.name;
  if (policy_.loss_scaling) st.extra["loss_scaler"] = scaler_.state();
  double t0 = now_seconds();
  std::string dir = ckpt::save_checkpoint(checkpoint_root(), st, model_->params().tensors(),
                                          optim_->state_tensors(), opt_.keep_last);
  if (!opt_.quiet) log_info("saved checkpoint ", dir, " (", now_seconds() - t0, " s)");
}

bool Trainer::resume_from(const std::string& path) {
  ckpt::Checkpoint c(path);
  const Json& extra = c.state().extra;
  std::string fp =
      extra.contains("model_fingerprint") ? extra.at("model_fingerprint").as_string() : "";
  LOOM_CHECK(fp == mcfg_.fingerprint(), c.dir(), ": checkpoint is for model '", fp,
             "', but this run's model is '", mcfg_.fingerprint(), "'");
  std::string prec = extra.contains("precision") ? extra.at("precision").as_string() : "";
  LOOM_CHECK(prec == policy_.name, c.dir(), ": checkpoint was trained with precision '", prec,
             "', this run uses '", policy_.name, "'");
  c.restore_model(model_->params().tensors());
  c.restore_optim(optim_->state_tensors());
  optim_->set_steps_taken(extra.at("optimizer_steps").as_int());
  if (policy_.loss_scaling) scaler_.restore(extra.at("loss_scaler"));
  train_data_->restore(c.state().data);
  step_ = c.state().step;
  if (!opt_.quiet) log_info("resumed from ", c.dir(), " at step ", step_);
  return true;
}

}  // namespace loom
