// `loom rl`: GRPO on a built-in verifiable task (or an HTTP environment), in one process:
// synchronous (every step samples groups from the current weights, then updates) or, with
// --async, a rollout thread and the learner overlapping through the versioned replay buffer
// (src/rl/async_grpo.h), or over MPI ranks with --rollout-ranks K under `loom launch -n N`:
// rank 0 learns, ranks 1..K generate (src/rl/mpi_grpo.h). Writes metrics.jsonl (reward, accuracy,
// KL, clip fraction, staleness, importance weights, utilisation, timings) and checkpoints (weights
// + optimizer + step) that resume (--resume) and that generate and serve read.
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "ckpt/checkpoint.h"
#include "cli/command.h"
#include "cli/options.h"
#include "cli/rl_settings.h"
#include "cli/serving_setup.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "infer/generator.h"
#include "optim/adamw.h"
#include "rl/async_grpo.h"
#include "rl/evaluate.h"
#include "rl/grpo_trainer.h"
#include "rl/http_env.h"
#include "rl/mpi_grpo.h"
#include "rl/rl_checkpoint.h"
#include "rl/weight_sync.h"
#include "train/device.h"
#include "train/metrics.h"

namespace loom::cli {

namespace {

int run_rl_here(const Args& args) {
  Options o(
      "loom rl --ckpt PATH --env arithmetic|reverse|countdown --out DIR [options]\n"
      "  loom rl --config FILE [--set KEY=VALUE ...] [options]",
      "GRPO from a checkpoint on a built-in task with exact-match rewards, in one process:\n"
      "synchronous by default; --async overlaps a rollout thread with the learner, using\n"
      "data at most --max-staleness steps old (importance-weighted).\n"
      "Settings are keys of [rl] and of loom train's [model] [parallel] [precision] [optim]\n"
      "(docs/rl.md); each option below is an alias of the key it names. The command line\n"
      "overrides the file; an option and a --set of the same key that disagree are refused.");
  RlSettings::declare(o);
  if (!o.parse(args)) return 0;
  const RlSettings c(o);
  for (const char* required : {"rl.ckpt", "rl.out"})
    LOOM_CHECK(c.given(required), "missing required option ", c.name(required), " (", required,
               ")");
  const std::string ckpt_path = c.text("rl.ckpt"), out = c.text("rl.out");
  rl::RlOptions ro;
  const int64_t steps = c.integer("rl.steps", 1, 1000000);
  ro.prompts_per_step = c.integer32("rl.prompts", 1, 4096);
  ro.group_size = c.integer32("rl.group", 2, 128);
  ro.max_tokens = c.integer32("rl.max_tokens", 1, 1 << 16);
  ro.temperature = static_cast<float>(c.number("rl.temperature"));
  LOOM_CHECK(ro.temperature > 0 && ro.temperature <= 10, c.name("rl.temperature"),
             " must lie in (0, 10]");
  ro.lr = c.number("optim.lr");
  LOOM_CHECK(ro.lr > 0 && ro.lr < 1, c.name("optim.lr"), " must lie in (0, 1)");
  ro.adam = adamw_config_from(c.config());
  // The policy's precision (the optimizer keeps an fp32 master under bf16 and fp16; fp16 scales
  // its loss) and the learners' ZeRO stage, as loom train reads them.
  ro.precision = precision_from_name(c.config().get_string("precision.policy", "fp32"));
  ro.scaler = LossScaler::options_from(c.config());
  ro.zero = static_cast<int>(c.config().get_int("parallel.zero", 0, 0, 3));
  {
    const std::string reduce = c.config().get_string("parallel.grad_reduce_dtype", "fp32");
    LOOM_CHECK(reduce == "fp32" || reduce == "bf16", "parallel.grad_reduce_dtype (",
               c.config().where("parallel.grad_reduce_dtype"),
               ") must be \"fp32\" or \"bf16\", not \"", reduce, "\"");
    ro.grad_reduce = reduce == "bf16" ? DType::BF16 : DType::F32;
  }
  ro.grpo.beta = c.number("rl.beta");
  ro.grpo.eps_low = c.number("rl.eps_low");
  ro.grpo.eps_high = c.number("rl.eps_high");
  ro.grpo.is_cap = c.number("rl.is_cap");
  LOOM_CHECK(
      ro.grpo.beta >= 0 && ro.grpo.eps_low > 0 && ro.grpo.eps_low < 1 && ro.grpo.eps_high > 0,
      c.name("rl.beta"), " must be >= 0, ", c.name("rl.eps_low"), " in (0, 1), ",
      c.name("rl.eps_high"), " > 0");
  LOOM_CHECK(ro.grpo.is_cap >= 1 && ro.grpo.is_cap <= 1000, c.name("rl.is_cap"),
             " must lie in [1, 1000]");
  ro.grpo.scale_by_std = !c.flag("rl.no_std");
  ro.grpo.token_level = !c.flag("rl.sequence_level");
  ro.seed = static_cast<uint64_t>(c.integer("rl.seed", 0, INT64_MAX));
  ro.rollout_timeout = c.number("rl.rollout_timeout");
  LOOM_CHECK(ro.rollout_timeout >= 0, c.name("rl.rollout_timeout"), " must be >= 0");
  const bool async = c.flag("rl.async");
  rl::AsyncOptions ao;
  ao.max_staleness = c.integer("rl.max_staleness", 0, 1000);
  const int rollout_ranks = c.integer32("rl.rollout_ranks", 0, 1 << 20);
  const bool mpi = rollout_ranks > 0;
  // The policy's device: its rollouts (the serving engine), learner, reference and optimizer
  // all run there; a build without CUDA or a machine without a GPU is refused here.
  const std::string device = c.text("rl.device");
  check_device(device, c.name("rl.device"));
  LOOM_CHECK(device == "cpu" || !mpi, c.name("rl.device"), " ", device,
             " runs in one process; over --rollout-ranks the ranks compute on the CPU");
  // One process's rollouts read the policy's whole weights, which ZeRO-3 does not keep; over
  // --rollout-ranks the learners gather them for the weight sync.
  LOOM_CHECK(ro.zero <= 2 || mpi, "parallel.zero = ", ro.zero, " (",
             c.config().where("parallel.zero"), "): loom rl runs ZeRO 0-2 in one process and ",
             "ZeRO 0-3 over --rollout-ranks");
  LOOM_CHECK(!(mpi && async), "--async runs in one process; --rollout-ranks runs over MPI ranks ",
             "(both asynchronous): choose one");
  LOOM_CHECK(async || mpi || !c.given("rl.max_staleness"), c.name("rl.max_staleness"),
             " needs --async or --rollout-ranks");
  LOOM_CHECK(mpi || !c.given("rl.weight_sync"), c.name("rl.weight_sync"), " needs --rollout-ranks");
  LOOM_CHECK(mpi || !c.given("parallel.tp"), c.name("parallel.tp"), " needs --rollout-ranks");
  const int learner_tp = c.integer32("parallel.tp", 1, 1 << 20);
  const bool learner_sp = c.flag("parallel.sp");
  LOOM_CHECK(!learner_sp || learner_tp > 1, c.name("parallel.sp"), " needs --learner-tp > 1");
  LOOM_CHECK(mpi || (!c.given("parallel.ep") && !c.given("parallel.etp")), c.name("parallel.ep"),
             " and ", c.name("parallel.etp"), " need --rollout-ranks");
  const int learner_ep = c.integer32("parallel.ep", 1, 1 << 20);
  const int learner_etp = c.integer32("parallel.etp", 1, 1 << 20);
  LOOM_CHECK(ro.zero == 0 || (learner_tp == 1 && learner_ep == 1 && learner_etp == 1),
             "parallel.zero = ", ro.zero, " (", c.config().where("parallel.zero"), ") with ",
             c.name("parallel.tp"), " ", learner_tp, ", ", c.name("parallel.ep"), " ", learner_ep,
             ", ", c.name("parallel.etp"), " ", learner_etp,
             ": tensor- and expert-parallel learners run at ZeRO-0");
  const DType weight_dtype = rl::weight_sync_dtype(c.text("rl.weight_sync"));
  ro.partial_tokens = c.integer32("rl.partial_tokens", 0, 1 << 16);
  LOOM_CHECK(ro.partial_tokens == 0 || async || mpi, c.name("rl.partial_tokens"),
             " needs --async or --rollout-ranks (partial rollouts continue on "
             "newer weights, which the synchronous loop never has)");
  ro.learner_share = c.number("rl.learner_share");
  LOOM_CHECK(ro.learner_share >= 0 && ro.learner_share < 1, c.name("rl.learner_share"),
             " must lie in [0, 1)");
  LOOM_CHECK(ro.learner_share == 0 || async, c.name("rl.learner_share"),
             " needs --async (the rollout thread computes that share)");
  if (mpi)
    rl::check_rl_layout(comm::world().size(), rollout_ranks);
  else
    LOOM_CHECK(!comm::launched_distributed(), "loom rl runs on ", comm::world().size(),
               " ranks only with --rollout-ranks K (ranks 1..K generate, the others learn)");
  ao.learner_timeout = c.number("rl.learner_timeout");
  LOOM_CHECK(ao.learner_timeout > 0 && ao.learner_timeout <= 86400, c.name("rl.learner_timeout"),
             " must lie in (0, 86400] seconds");
  ao.threads_per_role = c.integer32("rl.threads_per_role", 0, 4096);
  const int64_t save_every = c.integer("rl.save_every", 0, 1000000);
  const int64_t eval_every = c.integer("rl.eval_every", 0, 1000000);
  const int eval_tasks = c.integer32("rl.eval_tasks", 1, 100000);
  const bool resume = c.flag("rl.resume");
  std::unique_ptr<rl::Environment> env;
  std::shared_ptr<rl::HttpEnvStats> http_stats;
  if (c.text("rl.env") == "http") {
    rl::HttpEnvOptions ho;
    ho.url = c.text("rl.env_url");
    LOOM_CHECK(!ho.url.empty(), "--env http needs ", c.name("rl.env_url"));
    ho.timeout_s = c.number("rl.env_timeout");
    ho.retries = c.integer32("rl.env_retries", 0, 100);
    std::vector<rl::Task> tasks, eval;
    if (!c.text("rl.env_tasks").empty()) tasks = rl::load_task_file(c.text("rl.env_tasks"));
    if (!c.text("rl.env_eval_tasks").empty()) {
      eval = rl::load_task_file(c.text("rl.env_eval_tasks"));
      // Held-out means not trained on: a list that is all training prompts is refused, a
      // partial overlap warned about.
      std::set<std::string> train;
      for (const rl::Task& t : tasks) train.insert(t.prompt);
      int64_t shared = 0;
      for (const rl::Task& t : eval) shared += train.count(t.prompt) > 0;
      LOOM_CHECK(shared < int64_t(eval.size()), c.name("rl.env_eval_tasks"), " ",
                 c.text("rl.env_eval_tasks"), ": every one of its ", eval.size(),
                 " prompts is a training prompt of ", c.name("rl.env_tasks"), ": no held-out task");
      if (shared > 0)
        log_warn(c.name("rl.env_eval_tasks"), ": ", shared, " of its ", eval.size(),
                 " prompts are training prompts too");
    }
    LOOM_CHECK(eval_every == 0 || tasks.empty() || !eval.empty(), c.name("rl.eval_every"),
               " with a training task file (", c.name("rl.env_tasks"), ") needs a held-out one (",
               c.name("rl.env_eval_tasks"), "): the training tasks are no held-out set");
    auto prompts = tasks.empty() ? rl::make_environment(c.text("rl.env_prompts")) : nullptr;
    env = rl::make_http_environment(ho, std::move(tasks), std::move(eval), std::move(prompts),
                                    &http_stats);
  } else {
    LOOM_CHECK(c.text("rl.env_url").empty() && c.text("rl.env_tasks").empty() &&
                   c.text("rl.env_eval_tasks").empty(),
               "--env-url, --env-tasks and --env-eval-tasks need --env http");
    env = rl::make_environment(c.text("rl.env"));
  }

  auto model = load_model_from_checkpoint(ckpt_path);
  c.check_model(model->config(), ckpt_path);
  // The policy computes in the precision's type on every rank: a learner's fp32 weights are
  // taken as the master, a rollout rank's are replaced by the learner's (rounded) weights.
  if (ro.precision.compute != DType::F32) {
    auto policy = std::make_unique<Decoder>(model->config(), model->backend(), Recompute::None,
                                            ro.precision.compute);
    policy->params().copy_values_from(model->params());
    model = std::move(policy);
  }
  const std::string tokenizer = c.text("rl.tokenizer"), chat_template = c.text("rl.chat_template");
  c.check_all_read();
  auto tok = checkpoint_tokenizer(ckpt_path, tokenizer, *model);
  LOOM_CHECK(tok, "loom rl needs a tokenizer with the chat template's special tokens");
  data::ChatTemplate chat(chat_template, *tok);
  rl::MpiRlOptions mo;
  mo.rollout_ranks = rollout_ranks;
  mo.weight_dtype = weight_dtype;
  mo.max_staleness = ao.max_staleness;
  mo.learner_timeout = ao.learner_timeout;
  mo.steps = steps;
  mo.learner_tp = learner_tp;
  mo.learner_sp = learner_sp;
  mo.learner_ep = learner_ep;
  mo.learner_etp = learner_etp;
  mo.save_every = save_every;
  const int rank = comm::world().rank();
  if (mpi && rank > rollout_ranks) {
    // Another data-parallel learner (ranks K+1..N-1): it restores what learner 0 restores
    // (every learner must start from the same step and weights; MpiGrpo checks), takes the same
    // steps on its share of the groups, and writes nothing.
    rl::RlRestore restore;
    std::optional<std::string> latest;
    if (resume) latest = ckpt::find_latest_checkpoint(out + "/checkpoints");
    if (latest) restore = rl::open_rl_checkpoint(*latest, model->config().fingerprint()).restore;
    rl::MpiGrpo learner(comm::world(), *model, *tok, chat, *env, ro, mo, restore);
    for (int64_t s = learner.first_step(); s < steps; ++s) learner.step();
    learner.finish();
    return 0;
  }
  if (mpi && rank != 0) {
    // A rollout rank: the learner's weights arrive in the constructor; it writes nothing.
    rl::MpiGrpo rollout(comm::world(), *model, *tok, chat, *env, ro, mo);
    log_info("rollout rank ", comm::world().rank(), " of ", rollout_ranks, ": from step ",
             rollout.first_step(), ", weights as ", dtype_name(weight_dtype));
    rollout.run_rollout();
    return 0;
  }
  make_dirs(out);
  const std::string root = out + "/checkpoints";
  ckpt::Checkpoint start(ckpt_path);
  const std::string fingerprint = model->config().fingerprint();

  // A resume restores the learner (weights, optimizer, step) after the reference model has
  // copied the starting weights; the rollouts then start from the restored weights, and an
  // asynchronous run first trains on the groups its checkpoint had buffered.
  std::optional<std::string> latest;
  if (resume) latest = ckpt::find_latest_checkpoint(root);
  int64_t first_step = 0;
  rl::RlRestore restore;
  if (latest) {
    rl::RlResumePoint rp = rl::open_rl_checkpoint(*latest, fingerprint);
    first_step = rp.step;
    restore = rp.restore;
    int64_t buffered = 0;
    for (const rl::BufferedStep& b : rp.buffer) buffered += int64_t(b.groups.size());
    const size_t carried = rp.carried.size();
    if (async) {
      ao.resume_buffer = std::move(rp.buffer);
      ao.resume_carry = std::move(rp.carried);
    } else if (mpi) {
      mo.resume_buffer = std::move(rp.buffer);
      mo.resume_carry = std::move(rp.carried);
    } else if (buffered > 0 || carried > 0) {
      log_warn(*latest, " holds ", buffered, " buffered rollout groups and ", carried,
               " unfinished ones of an asynchronous run; the synchronous loop regenerates them ",
               "from the restored weights instead");
    }
    if (async || mpi) log_info("the replay buffer holds ", buffered, " groups from the checkpoint");
    if ((async || mpi) && carried > 0)
      log_info("partial rollouts: ", carried, " unfinished groups from the checkpoint continue");
  }
  std::unique_ptr<rl::GrpoTrainer> sync_loop;
  std::unique_ptr<rl::AsyncGrpo> async_loop;
  std::unique_ptr<rl::MpiGrpo> mpi_loop;
  if (mpi)
    mpi_loop =
        std::make_unique<rl::MpiGrpo>(comm::world(), *model, *tok, chat, *env, ro, mo, restore);
  else if (async)
    async_loop = std::make_unique<rl::AsyncGrpo>(*model, *tok, chat, *env, ro, ao, restore);
  else
    sync_loop = std::make_unique<rl::GrpoTrainer>(*model, *tok, chat, *env, ro, restore);
  rl::GrpoLearner& learner = mpi     ? mpi_loop->learner()
                             : async ? async_loop->learner()
                                     : sync_loop->learner();
  LOOM_CHECK(first_step <= steps, "the checkpoint ", latest.value_or(""), " is at step ",
             first_step, ", past ", c.name("rl.steps"), " ", steps);
  if (latest) log_info("resumed from ", *latest, " at step ", first_step);
  MetricsLog metrics(out + "/metrics.jsonl", latest.has_value(), "", first_step - 1);

  rl::RlCheckpointInfo info;
  info.config_text = start.state().config_text;
  info.fingerprint = fingerprint;
  info.description = cat("grpo ", env->name(), " from ", start.dir());
  info.max_staleness = async || mpi ? ao.max_staleness : int64_t(0);
  info.precision = ro.precision.name;
  auto save = [&](int64_t step) {
    // With --async the groups generated ahead of the learner go with the weights (one cut: the
    // rollout batch in flight reaches the buffer first); over MPI ranks those of the next
    // max-staleness steps, received from the rollout ranks first.
    // With partial rollouts also the groups cut and not finished at that point.
    std::vector<rl::PromptGroup> carried;
    const std::vector<rl::BufferedStep> buffer = async_loop ? async_loop->buffer_contents(&carried)
                                                 : mpi_loop ? mpi_loop->buffer_contents(&carried)
                                                            : std::vector<rl::BufferedStep>{};
    // fp16: the loss scaler's state, so that a resume continues its scale.
    const StepEngine& engine = learner.engine().engine();
    info.loss_scaler = engine.loss_scaling() ? engine.scaler().state() : Json();
    // Under --learner-tp/-ep/-etp or ZeRO the whole optimizer state, gathered by the learners
    // at this step.
    return rl::save_rl_checkpoint(root, step, info, *model,
                                  mpi_loop ? mpi_loop->checkpoint_optimizer() : learner.optimizer(),
                                  buffer, carried);
  };

  const std::string tp_groups =
      (learner_tp > 1 ? cat(" as TP groups of ", learner_tp, learner_sp ? " with SP" : "") : "") +
      (learner_ep > 1 ? cat(", experts split over ", learner_ep, " of them (EP)") : "") +
      (learner_etp > 1 ? cat(", each expert over ", learner_etp, " TP ranks (ETP)") : "");
  log_info("GRPO on ", env->name(),
           (mpi     ? cat(", over ", rollout_ranks, " rollout rank(s) + ",
                          comm::world().size() - rollout_ranks, " learner rank(s)", tp_groups,
                          " (max staleness ", ao.max_staleness, ", weights sent as ",
                          dtype_name(weight_dtype), ")")
            : async ? cat(", async (max staleness ", ao.max_staleness,
                          ro.partial_tokens > 0
                              ? cat(", partial rollouts of ", ro.partial_tokens, " tokens a batch")
                              : std::string(),
                          ")")
                    : std::string(", synchronous")),
           ": ", ro.prompts_per_step, " prompts x ", ro.group_size, " completions per step, ",
           ro.max_tokens, " tokens at most, lr ", ro.lr, ", beta ", ro.grpo.beta, ", ",
           ro.precision.name, " policy", ro.zero > 0 ? cat(", ZeRO-", ro.zero) : std::string());
  // The starting point of the held-out curve, before any step of a fresh run.
  std::optional<double> initial_accuracy;
  if (eval_every > 0 && first_step == 0 && steps > 0) {
    initial_accuracy =
        rl::heldout_accuracy(*model, *tok, chat, *env, eval_tasks, ro.seed, ro.max_tokens);
    log_info("held-out accuracy before training ", *initial_accuracy, " (", eval_tasks,
             " greedy replies)");
  }
  const double t0 = now_seconds();
  rl::RlStepStats run;  // the run's groups: trained, and dropped by cause
  for (int64_t s = first_step; s < steps; ++s) {
    const rl::RlStepStats st = mpi     ? mpi_loop->step()
                               : async ? async_loop->step()
                                       : sync_loop->step();
    run.groups += st.groups;
    run.dropped_env += st.dropped_env;
    run.dropped_timeout += st.dropped_timeout;
    run.dropped_stale += st.dropped_stale;
    Json j = st.json();
    j["wall_seconds"] = now_seconds() - t0;
    if (s == 0 && initial_accuracy) j["heldout_accuracy_initial"] = *initial_accuracy;
    if (eval_every > 0 && ((s + 1) % eval_every == 0 || s + 1 == steps)) {
      const double acc =
          rl::heldout_accuracy(*model, *tok, chat, *env, eval_tasks, ro.seed, ro.max_tokens);
      j["heldout_accuracy"] = acc;
      log_info("held-out accuracy ", acc, " (", eval_tasks, " greedy replies)");
    }
    metrics.write(j);
    const double eta = (now_seconds() - t0) / double(s + 1 - first_step) * double(steps - s - 1);
    log_info("step ", s + 1, "/", steps, " | reward ", st.reward_mean, " | accuracy ", st.accuracy,
             " | length ", st.response_length, " | kl ", st.kl, " | entropy ",
             st.train_tokens > 0 ? cat(st.entropy) : std::string("-"), " | clip ", st.clip_fraction,
             " | no-signal groups ", st.zero_advantage_groups, "/", st.groups, " | gen ",
             static_cast<int>(st.generation_tokens_per_s), " tok/s | ETA ", static_cast<int>(eta),
             "s");
    if (save_every > 0 && (s + 1) % save_every == 0 && s + 1 < steps)
      log_info("saved ", save(s + 1));
  }
  if (async_loop) async_loop->stop();
  if (mpi_loop) mpi_loop->finish();
  if (http_stats)
    log_info("environment calls ", http_stats->calls, ", retries ", http_stats->retries,
             ", failed ", http_stats->failed, ", malformed ", http_stats->malformed,
             ", reward out of range ", http_stats->out_of_range);
  // A run that trained on nothing is a failure, not a run with reward 0.
  LOOM_CHECK(run.groups > 0 || first_step >= steps, "every group of the run's ", steps - first_step,
             " step(s) was dropped (", run.dropped_env, " for environment errors, ",
             run.dropped_timeout, " past --rollout-timeout, ", run.dropped_stale,
             " past --max-staleness)",
             http_stats ? cat("; environment ", o.get("env-url"), ": ", http_stats->calls,
                              " calls, ", http_stats->failed, " failed, ", http_stats->malformed,
                              " malformed, ", http_stats->out_of_range, " rewards out of range")
                        : std::string(),
             ": nothing was trained, so no checkpoint is written");
  log_info("saved ", save(steps));
  return 0;
}

}  // namespace

int run_rl(const Args& args) {
  try {
    return run_rl_here(args);
  } catch (const Error& e) {
    // Over MPI one rank's error ends every rank (a rollout rank waiting for weights, the learner
    // waiting for groups) with the message, instead of leaving them to their timeouts.
    if (comm::launched_distributed()) comm::abort_job(e.what());
    throw;
  }
}

}  // namespace loom::cli
