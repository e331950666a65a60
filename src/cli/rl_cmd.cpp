// `loom rl`: GRPO on a built-in verifiable task, in one process and synchronously (the
// asynchronous rollout/learner split is the next step of issue 15). Starts from a checkpoint,
// writes metrics.jsonl (reward, accuracy, KL, clip fraction, timings) and a checkpoint that
// generate and serve read.
#include <cstdio>

#include "ckpt/checkpoint.h"
#include "cli/command.h"
#include "cli/options.h"
#include "cli/serving_setup.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "infer/generator.h"
#include "rl/grpo_trainer.h"
#include "train/metrics.h"

namespace loom::cli {

int run_rl(const Args& args) {
  Options o("loom rl --ckpt PATH --env arithmetic|reverse|countdown --out DIR [options]",
            "GRPO from a checkpoint on a built-in task with exact-match rewards (one process,\n"
            "synchronous: every step samples groups from the current weights, then updates).");
  o.value("ckpt", "", "starting checkpoint (a chat model: its tokenizer has the template's tokens)",
          true)
      .value("env", "reverse", "arithmetic, reverse or countdown")
      .value("out", "", "output directory (metrics.jsonl, checkpoints/)", true)
      .value("steps", "20", "GRPO steps")
      .value("prompts", "8", "prompts per step")
      .value("group", "8", "completions per prompt (G)")
      .value("max-tokens", "16", "tokens per completion at most")
      .value("temperature", "1.0", "sampling temperature of the rollouts")
      .value("lr", "1e-5", "learning rate")
      .value("beta", "0", "KL coefficient (0: no reference model)")
      .value("eps-low", "0.2", "lower clip range")
      .value("eps-high", "0.28", "upper clip range (DAPO)")
      .flag("no-std", "Dr. GRPO: advantages not divided by the group's std")
      .flag("sequence-level", "normalise per sequence, not per token")
      .value("seed", "1", "task and sampling seed")
      .value("chat-template", "chatml", "chat template of the prompts")
      .value("tokenizer", "", "tokenizer spec (default: the checkpoint's data.tokenizer)");
  if (!o.parse(args)) return 0;
  rl::RlOptions ro;
  const int64_t steps = o.get_int("steps");
  LOOM_CHECK(steps > 0 && steps <= 1000000, "--steps must lie in [1, 1000000]");
  ro.prompts_per_step = static_cast<int>(o.get_int("prompts"));
  ro.group_size = static_cast<int>(o.get_int("group"));
  ro.max_tokens = static_cast<int>(o.get_int("max-tokens"));
  LOOM_CHECK(ro.prompts_per_step > 0 && ro.prompts_per_step <= 4096,
             "--prompts must lie in [1, 4096]");
  LOOM_CHECK(ro.group_size > 1 && ro.group_size <= 128, "--group must lie in [2, 128]");
  LOOM_CHECK(ro.max_tokens > 0 && ro.max_tokens <= 1 << 16, "--max-tokens must lie in [1, 65536]");
  ro.temperature = static_cast<float>(o.get_double("temperature"));
  LOOM_CHECK(ro.temperature > 0 && ro.temperature <= 10, "--temperature must lie in (0, 10]");
  ro.lr = o.get_double("lr");
  LOOM_CHECK(ro.lr > 0 && ro.lr < 1, "--lr must lie in (0, 1)");
  ro.grpo.beta = o.get_double("beta");
  ro.grpo.eps_low = o.get_double("eps-low");
  ro.grpo.eps_high = o.get_double("eps-high");
  LOOM_CHECK(
      ro.grpo.beta >= 0 && ro.grpo.eps_low > 0 && ro.grpo.eps_low < 1 && ro.grpo.eps_high > 0,
      "--beta must be >= 0, --eps-low in (0, 1), --eps-high > 0");
  ro.grpo.scale_by_std = !o.has("no-std");
  ro.grpo.token_level = !o.has("sequence-level");
  ro.seed = static_cast<uint64_t>(o.get_int("seed"));
  auto env = rl::make_environment(o.get("env"));

  auto model = load_model_from_checkpoint(o.get("ckpt"));
  auto tok = checkpoint_tokenizer(o.get("ckpt"), o.get("tokenizer"), *model);
  LOOM_CHECK(tok, "loom rl needs a tokenizer with the chat template's special tokens");
  data::ChatTemplate chat(o.get("chat-template"), *tok);
  const std::string out = o.get("out");
  make_dirs(out);
  MetricsLog metrics(out + "/metrics.jsonl", false, "");
  rl::GrpoTrainer t(*model, *tok, chat, *env, ro);
  log_info("GRPO on ", env->name(), ": ", ro.prompts_per_step, " prompts x ", ro.group_size,
           " completions per step, ", ro.max_tokens, " tokens at most, lr ", ro.lr, ", beta ",
           ro.grpo.beta);
  const double t0 = now_seconds();
  for (int64_t s = 0; s < steps; ++s) {
    const rl::RlStepStats st = t.step();
    Json j = st.json();
    metrics.write(j);
    const double eta = (now_seconds() - t0) / double(s + 1) * double(steps - s - 1);
    log_info("step ", s + 1, "/", steps, " | reward ", st.reward_mean, " | accuracy ", st.accuracy,
             " | length ", st.response_length, " | kl ", st.kl, " | clip ", st.clip_fraction,
             " | no-signal groups ", st.zero_advantage_groups, "/", st.groups, " | gen ",
             static_cast<int>(st.generation_tokens_per_s), " tok/s | ETA ", static_cast<int>(eta),
             "s");
  }
  // The trained policy as a whole checkpoint, with the starting run's config (its model and
  // tokenizer) so generate and serve load it as they load any checkpoint.
  ckpt::Checkpoint start(o.get("ckpt"));
  ckpt::TrainerState st;
  st.step = steps;
  st.config_text = start.state().config_text;
  st.extra["model_fingerprint"] = model->config().fingerprint();
  st.extra["precision"] = "fp32";
  st.extra["rl"] = cat("grpo ", env->name(), " from ", start.dir());
  const std::string dir =
      ckpt::save_checkpoint(out + "/checkpoints", st, model->params().tensors(), ckpt::TensorMap{});
  log_info("saved ", dir);
  return 0;
}

}  // namespace loom::cli
