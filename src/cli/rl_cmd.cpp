// `loom rl`: GRPO on a built-in verifiable task (or an HTTP environment), in one process:
// synchronous (every step samples groups from the current weights, then updates) or, with
// --async, a rollout thread and the learner overlapping through the versioned replay buffer
// (src/rl/async_grpo.h), or over MPI ranks with --rollout-ranks K under `loom launch -n N`:
// rank 0 learns, ranks 1..K generate (src/rl/mpi_grpo.h). Writes metrics.jsonl (reward, accuracy,
// KL, clip fraction, staleness, importance weights, utilisation, timings) and checkpoints (weights
// + optimizer + step) that resume (--resume) and that generate and serve read.
#include <cstdio>
#include <memory>

#include "ckpt/checkpoint.h"
#include "cli/command.h"
#include "cli/options.h"
#include "cli/serving_setup.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "infer/generator.h"
#include "rl/async_grpo.h"
#include "rl/evaluate.h"
#include "rl/grpo_trainer.h"
#include "rl/http_env.h"
#include "rl/mpi_grpo.h"
#include "rl/rl_checkpoint.h"
#include "rl/weight_sync.h"
#include "train/metrics.h"

namespace loom::cli {

namespace {

int run_rl_here(const Args& args) {
  Options o("loom rl --ckpt PATH --env arithmetic|reverse|countdown --out DIR [options]",
            "GRPO from a checkpoint on a built-in task with exact-match rewards, in one process:\n"
            "synchronous by default; --async overlaps a rollout thread with the learner, using\n"
            "data at most --max-staleness steps old (importance-weighted).");
  o.value("ckpt", "", "starting checkpoint (a chat model: its tokenizer has the template's tokens)",
          true)
      .value("env", "reverse", "arithmetic, reverse, countdown or http")
      .value("env-url", "", "--env http: the scoring service (POST prompt+completion -> reward)")
      .value("env-tasks", "", "--env http: a JSONL task file ({\"prompt\": ..., \"answer\": ...})")
      .value("env-prompts", "arithmetic", "--env http without --env-tasks: built-in prompts")
      .value("env-timeout", "10", "--env http: seconds per call")
      .value("env-retries", "2", "--env http: retries of a call that got no answer or a 5xx")
      .value("out", "", "output directory (metrics.jsonl, checkpoints/)", true)
      .value("steps", "20", "GRPO steps (in all, counting those before a resume)")
      .value("prompts", "8", "prompts per step")
      .value("group", "8", "completions per prompt (G)")
      .value("max-tokens", "16", "tokens per completion at most")
      .value("temperature", "1.0", "sampling temperature of the rollouts")
      .value("lr", "1e-5", "learning rate")
      .value("beta", "0", "KL coefficient (0: no reference model)")
      .value("eps-low", "0.2", "lower clip range")
      .value("eps-high", "0.28", "upper clip range (DAPO)")
      .value("is-cap", "2.0", "truncation of the importance weights of stale samples")
      .flag("no-std", "Dr. GRPO: advantages not divided by the group's std")
      .flag("sequence-level", "normalise per sequence, not per token")
      .flag("async", "overlap rollouts and learning (a rollout thread and the learner)")
      .value("max-staleness", "1", "with --async: the oldest data used, in steps (0: on policy)")
      .value("learner-timeout", "600", "seconds either side waits for the other before failing")
      .value("partial-tokens", "0",
             "with --async: tokens per completion per generation batch; longer completions "
             "continue in the next batch from newer weights (partial rollouts; 0: off)")
      .value("learner-share", "0",
             "with --async: share (0..1) of each step's forward and backward that the rollout "
             "thread computes while it waits for new weights (0: off)")
      .value("rollout-timeout", "0",
             "seconds per generation batch; later groups are dropped (0: none)")
      .value("rollout-ranks", "0",
             "under loom launch -n N: ranks 1..K generate, the other N - K learn (data-parallel)")
      .value("learner-tp", "1",
             "with --rollout-ranks: tensor-parallel ranks per data-parallel learner group")
      .flag("learner-sp", "with --learner-tp > 1: sequence parallelism inside each TP group")
      .value("learner-ep", "1",
             "with --rollout-ranks, a MoE policy: data-parallel learner groups the experts are "
             "split over (expert parallelism)")
      .value("learner-etp", "1",
             "with --rollout-ranks, a MoE policy: TP ranks each expert's width is split over")
      .value("weight-sync", "bf16", "with --rollout-ranks: weights broadcast as bf16 or f32")
      .value("threads-per-role", "0", "with --async: OpenMP/BLAS threads each (0: half the cores)")
      .value("save-every", "0", "checkpoint every N steps (0: only at the end)")
      .flag("resume", "continue from the newest checkpoint under --out (if any)")
      .value("eval-every", "0", "held-out greedy accuracy every N steps (0: never)")
      .value("eval-tasks", "64", "held-out tasks per evaluation")
      .value("seed", "1", "task and sampling seed")
      .value("chat-template", "chatml", "chat template of the prompts (chatml, llama3 or hf:PATH)")
      .value("tokenizer", "", "tokenizer spec (default: the checkpoint's data.tokenizer)");
  if (!o.parse(args)) return 0;
  rl::RlOptions ro;
  const int64_t steps = o.get_int("steps", 1, 1000000);
  ro.prompts_per_step = o.get_int32("prompts", 1, 4096);
  ro.group_size = o.get_int32("group", 2, 128);
  ro.max_tokens = o.get_int32("max-tokens", 1, 1 << 16);
  ro.temperature = static_cast<float>(o.get_double("temperature"));
  LOOM_CHECK(ro.temperature > 0 && ro.temperature <= 10, "--temperature must lie in (0, 10]");
  ro.lr = o.get_double("lr");
  LOOM_CHECK(ro.lr > 0 && ro.lr < 1, "--lr must lie in (0, 1)");
  ro.grpo.beta = o.get_double("beta");
  ro.grpo.eps_low = o.get_double("eps-low");
  ro.grpo.eps_high = o.get_double("eps-high");
  ro.grpo.is_cap = o.get_double("is-cap");
  LOOM_CHECK(
      ro.grpo.beta >= 0 && ro.grpo.eps_low > 0 && ro.grpo.eps_low < 1 && ro.grpo.eps_high > 0,
      "--beta must be >= 0, --eps-low in (0, 1), --eps-high > 0");
  LOOM_CHECK(ro.grpo.is_cap >= 1 && ro.grpo.is_cap <= 1000, "--is-cap must lie in [1, 1000]");
  ro.grpo.scale_by_std = !o.has("no-std");
  ro.grpo.token_level = !o.has("sequence-level");
  ro.seed = static_cast<uint64_t>(o.get_int("seed", 0, INT64_MAX));
  ro.rollout_timeout = o.get_double("rollout-timeout");
  LOOM_CHECK(ro.rollout_timeout >= 0, "--rollout-timeout must be >= 0");
  const bool async = o.has("async");
  rl::AsyncOptions ao;
  ao.max_staleness = o.get_int("max-staleness", 0, 1000);
  const int rollout_ranks = o.get_int32("rollout-ranks", 0, 1 << 20);
  const bool mpi = rollout_ranks > 0;
  LOOM_CHECK(!(mpi && async), "--async runs in one process; --rollout-ranks runs over MPI ranks ",
             "(both asynchronous): choose one");
  LOOM_CHECK(async || mpi || !o.has("max-staleness"),
             "--max-staleness needs --async or --rollout-ranks");
  LOOM_CHECK(mpi || !o.has("weight-sync"), "--weight-sync needs --rollout-ranks");
  LOOM_CHECK(mpi || !o.has("learner-tp"), "--learner-tp needs --rollout-ranks");
  const int learner_tp = o.get_int32("learner-tp", 1, 1 << 20);
  const bool learner_sp = o.has("learner-sp");
  LOOM_CHECK(!learner_sp || learner_tp > 1, "--learner-sp needs --learner-tp > 1");
  LOOM_CHECK(mpi || (!o.has("learner-ep") && !o.has("learner-etp")),
             "--learner-ep and --learner-etp need --rollout-ranks");
  const int learner_ep = o.get_int32("learner-ep", 1, 1 << 20);
  const int learner_etp = o.get_int32("learner-etp", 1, 1 << 20);
  const DType weight_dtype = rl::weight_sync_dtype(o.get("weight-sync"));
  ro.partial_tokens = o.get_int32("partial-tokens", 0, 1 << 16);
  LOOM_CHECK(ro.partial_tokens == 0 || async || mpi,
             "--partial-tokens needs --async or --rollout-ranks (partial rollouts continue on "
             "newer weights, which the synchronous loop never has)");
  ro.learner_share = o.get_double("learner-share");
  LOOM_CHECK(ro.learner_share >= 0 && ro.learner_share < 1, "--learner-share must lie in [0, 1)");
  LOOM_CHECK(ro.learner_share == 0 || async,
             "--learner-share needs --async (the rollout thread computes that share)");
  if (mpi)
    rl::check_rl_layout(comm::world().size(), rollout_ranks);
  else
    LOOM_CHECK(!comm::launched_distributed(), "loom rl runs on ", comm::world().size(),
               " ranks only with --rollout-ranks K (ranks 1..K generate, the others learn)");
  ao.learner_timeout = o.get_double("learner-timeout");
  LOOM_CHECK(ao.learner_timeout > 0 && ao.learner_timeout <= 86400,
             "--learner-timeout must lie in (0, 86400] seconds");
  ao.threads_per_role = o.get_int32("threads-per-role", 0, 4096);
  const int64_t save_every = o.get_int("save-every", 0, 1000000);
  const int64_t eval_every = o.get_int("eval-every", 0, 1000000);
  const int eval_tasks = o.get_int32("eval-tasks", 1, 100000);
  std::unique_ptr<rl::Environment> env;
  std::shared_ptr<rl::HttpEnvStats> http_stats;
  if (o.get("env") == "http") {
    rl::HttpEnvOptions ho;
    ho.url = o.get("env-url");
    LOOM_CHECK(!ho.url.empty(), "--env http needs --env-url");
    ho.timeout_s = o.get_double("env-timeout");
    ho.retries = o.get_int32("env-retries", 0, 100);
    std::vector<rl::Task> tasks;
    if (!o.get("env-tasks").empty()) tasks = rl::load_task_file(o.get("env-tasks"));
    auto prompts = tasks.empty() ? rl::make_environment(o.get("env-prompts")) : nullptr;
    env = rl::make_http_environment(ho, std::move(tasks), std::move(prompts), &http_stats);
  } else {
    LOOM_CHECK(o.get("env-url").empty() && o.get("env-tasks").empty(),
               "--env-url and --env-tasks need --env http");
    env = rl::make_environment(o.get("env"));
  }

  auto model = load_model_from_checkpoint(o.get("ckpt"));
  auto tok = checkpoint_tokenizer(o.get("ckpt"), o.get("tokenizer"), *model);
  LOOM_CHECK(tok, "loom rl needs a tokenizer with the chat template's special tokens");
  data::ChatTemplate chat(o.get("chat-template"), *tok);
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
    if (o.has("resume")) latest = ckpt::find_latest_checkpoint(o.get("out") + "/checkpoints");
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
  const std::string out = o.get("out");
  make_dirs(out);
  const std::string root = out + "/checkpoints";
  ckpt::Checkpoint start(o.get("ckpt"));
  const std::string fingerprint = model->config().fingerprint();

  // A resume restores the learner (weights, optimizer, step) after the reference model has
  // copied the starting weights; the rollouts then start from the restored weights, and an
  // asynchronous run first trains on the groups its checkpoint had buffered.
  std::optional<std::string> latest;
  if (o.has("resume")) latest = ckpt::find_latest_checkpoint(root);
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
             first_step, ", past --steps ", steps);
  if (latest) log_info("resumed from ", *latest, " at step ", first_step);
  MetricsLog metrics(out + "/metrics.jsonl", latest.has_value(), "", first_step - 1);

  rl::RlCheckpointInfo info;
  info.config_text = start.state().config_text;
  info.fingerprint = fingerprint;
  info.description = cat("grpo ", env->name(), " from ", start.dir());
  info.max_staleness = async || mpi ? ao.max_staleness : int64_t(0);
  auto save = [&](int64_t step) {
    // With --async the groups generated ahead of the learner go with the weights (one cut: the
    // rollout batch in flight reaches the buffer first); over MPI ranks those of the next
    // max-staleness steps, received from the rollout ranks first.
    // With partial rollouts also the groups cut and not finished at that point.
    std::vector<rl::PromptGroup> carried;
    const std::vector<rl::BufferedStep> buffer = async_loop ? async_loop->buffer_contents(&carried)
                                                 : mpi_loop ? mpi_loop->buffer_contents(&carried)
                                                            : std::vector<rl::BufferedStep>{};
    // Under --learner-tp/-ep/-etp the whole optimizer state, gathered by the learners at this
    // step.
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
           ro.max_tokens, " tokens at most, lr ", ro.lr, ", beta ", ro.grpo.beta);
  // The starting point of the held-out curve, before any step of a fresh run.
  std::optional<double> initial_accuracy;
  if (eval_every > 0 && first_step == 0 && steps > 0) {
    initial_accuracy =
        rl::heldout_accuracy(*model, *tok, chat, *env, eval_tasks, ro.seed, ro.max_tokens);
    log_info("held-out accuracy before training ", *initial_accuracy, " (", eval_tasks,
             " greedy replies)");
  }
  const double t0 = now_seconds();
  for (int64_t s = first_step; s < steps; ++s) {
    const rl::RlStepStats st = mpi     ? mpi_loop->step()
                               : async ? async_loop->step()
                                       : sync_loop->step();
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
