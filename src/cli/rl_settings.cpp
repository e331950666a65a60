#include "cli/rl_settings.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace loom::cli {

namespace {

struct Setting {
  const char* key;
  const char* flag;  // the command-line alias, without "--"
  const char* def;   // "" for none; a boolean flag's default is false
  bool boolean;      // a flag without a value: true when given
  const char* help;
};

// One row per setting, in --help's order.
const std::vector<Setting>& settings() {
  static const std::vector<Setting> all = {
      {"rl.ckpt", "ckpt", "", false,
       "starting checkpoint (a chat model: its tokenizer has the template's tokens; required)"},
      {"rl.env", "env", "reverse", false, "arithmetic, reverse, countdown or http"},
      {"rl.env_url", "env-url", "", false,
       "--env http: the scoring service (POST prompt+completion -> reward)"},
      {"rl.env_tasks", "env-tasks", "", false,
       "--env http: a JSONL task file ({\"prompt\": ..., \"answer\": ...})"},
      {"rl.env_eval_tasks", "env-eval-tasks", "", false,
       "--env http: a held-out JSONL task file for --eval-every (needed with --env-tasks)"},
      {"rl.env_prompts", "env-prompts", "arithmetic", false,
       "--env http without --env-tasks: built-in prompts"},
      {"rl.env_timeout", "env-timeout", "10", false, "--env http: seconds per call"},
      {"rl.env_retries", "env-retries", "2", false,
       "--env http: retries of a call that got no answer or a 5xx"},
      {"rl.out", "out", "", false, "output directory (metrics.jsonl, checkpoints/; required)"},
      {"rl.device", "device", "cpu", false,
       "where the policy generates and learns: cpu or cuda (one process)"},
      {"rl.steps", "steps", "20", false, "GRPO steps (in all, counting those before a resume)"},
      {"rl.prompts", "prompts", "8", false, "prompts per step"},
      {"rl.group", "group", "8", false, "completions per prompt (G)"},
      {"rl.max_tokens", "max-tokens", "16", false, "tokens per completion at most"},
      {"rl.temperature", "temperature", "1.0", false, "sampling temperature of the rollouts"},
      {"optim.lr", "lr", "1e-5", false, "learning rate"},
      {"rl.beta", "beta", "0", false, "KL coefficient (0: no reference model)"},
      {"rl.eps_low", "eps-low", "0.2", false, "lower clip range"},
      {"rl.eps_high", "eps-high", "0.28", false, "upper clip range (DAPO)"},
      {"rl.is_cap", "is-cap", "2.0", false,
       "truncation of the importance weights of stale samples"},
      {"rl.no_std", "no-std", "", true, "Dr. GRPO: advantages not divided by the group's std"},
      {"rl.sequence_level", "sequence-level", "", true, "normalise per sequence, not per token"},
      {"rl.async", "async", "", true,
       "overlap rollouts and learning (a rollout thread and the learner)"},
      {"rl.max_staleness", "max-staleness", "1", false,
       "with --async: the oldest data used, in steps (0: on policy)"},
      {"rl.learner_timeout", "learner-timeout", "600", false,
       "seconds either side waits for the other before failing"},
      {"rl.partial_tokens", "partial-tokens", "0", false,
       "with --async: tokens per completion per generation batch; longer completions continue "
       "in the next batch from newer weights (partial rollouts; 0: off)"},
      {"rl.learner_share", "learner-share", "0", false,
       "with --async: share (0..1) of each step's forward and backward that the rollout thread "
       "computes while it waits for new weights (0: off)"},
      {"rl.rollout_timeout", "rollout-timeout", "0", false,
       "seconds per generation batch; later groups are dropped (0: none)"},
      {"rl.rollout_ranks", "rollout-ranks", "0", false,
       "under loom launch -n N: ranks 1..K generate, the other N - K learn (data-parallel)"},
      {"parallel.tp", "learner-tp", "1", false,
       "with --rollout-ranks: tensor-parallel ranks per data-parallel learner group"},
      {"parallel.sp", "learner-sp", "", true,
       "with --learner-tp > 1: sequence parallelism inside each TP group"},
      {"parallel.ep", "learner-ep", "1", false,
       "with --rollout-ranks, a MoE policy: data-parallel learner groups the experts are split "
       "over (expert parallelism)"},
      {"parallel.etp", "learner-etp", "1", false,
       "with --rollout-ranks, a MoE policy: TP ranks each expert's width is split over"},
      {"rl.weight_sync", "weight-sync", "bf16", false,
       "with --rollout-ranks: weights broadcast as bf16 or f32"},
      {"rl.threads_per_role", "threads-per-role", "0", false,
       "with --async: OpenMP/BLAS threads each (0: half the cores)"},
      {"rl.save_every", "save-every", "0", false, "checkpoint every N steps (0: only at the end)"},
      {"rl.resume", "resume", "", true, "continue from the newest checkpoint under --out (if any)"},
      {"rl.eval_every", "eval-every", "0", false,
       "held-out greedy accuracy every N steps (0: never)"},
      {"rl.eval_tasks", "eval-tasks", "64", false, "held-out tasks per evaluation"},
      {"rl.seed", "seed", "1", false, "task and sampling seed"},
      {"rl.chat_template", "chat-template", "chatml", false,
       "chat template of the prompts (chatml, llama3 or hf:PATH)"},
      {"rl.tokenizer", "tokenizer", "", false,
       "tokenizer spec (default: the checkpoint's data.tokenizer)"},
  };
  return all;
}

const Setting& setting(const std::string& key) {
  for (const Setting& s : settings())
    if (key == s.key) return s;
  fail("internal: loom rl setting '", key, "' not declared");
}

// Keys of loom train's sections that GRPO honours without a flag of their own.
constexpr const char* kKeysWithoutFlag[] = {"optim.beta1",
                                            "optim.beta2",
                                            "optim.eps",
                                            "optim.weight_decay",
                                            "precision.policy",
                                            "precision.initial_loss_scale",
                                            "precision.loss_scale_window",
                                            "precision.min_loss_scale",
                                            "parallel.zero",
                                            "parallel.grad_reduce_dtype"};
constexpr const char* kTrainerSections[] = {"model", "parallel", "precision", "optim"};

// Two spellings of one value: "1e-5" and "0.00001", "2" and "2.0" are the same number.
bool same_value(const std::string& a, const std::string& b) {
  char* ea = nullptr;
  char* eb = nullptr;
  const double x = std::strtod(a.c_str(), &ea), y = std::strtod(b.c_str(), &eb);
  if (!a.empty() && !b.empty() && *ea == 0 && *eb == 0) return x == y;
  return a == b;
}

}  // namespace

void RlSettings::declare(Options& o) {
  o.value("config", "",
          "TOML file: [rl] plus loom train's [model] [parallel] [precision] [optim] (docs/rl.md)")
      .multi("set", "any key, e.g. --set rl.steps=40 (the flags below are aliases of keys)");
  for (const Setting& s : settings()) {
    const std::string help = cat(s.help, " (", s.key, ")");
    if (s.boolean)
      o.flag(s.flag, help);
    else
      o.value(s.flag, s.def, help);
  }
}

RlSettings::RlSettings(const Options& o) {
  if (o.has("config")) cfg_ = Config::load(o.get("config"));
  for (const std::string& kv : o.all("set")) cfg_.set_override(kv, "--set");
  for (const Setting& s : settings()) {
    if (!o.has(s.flag)) continue;
    const std::string value = s.boolean ? "true" : o.get(s.flag);
    if (cfg_.has(s.key) && cfg_.where(s.key) == "--set") {
      const std::string set = cfg_.get_string(s.key, "");
      LOOM_CHECK(same_value(set, value), "--", s.flag, " ", value, " and --set ", s.key, "=", set,
                 " disagree: --", s.flag, " is ", s.key, "; give one");
    }
    cfg_.set(s.key, value, cat("--", s.flag));
  }
}

std::string RlSettings::text(const std::string& key) const {
  return cfg_.get_string(key, setting(key).def);
}

int64_t RlSettings::integer(const std::string& key, int64_t lo, int64_t hi) const {
  return cfg_.get_int(key, std::stoll(setting(key).def), lo, hi);
}

double RlSettings::number(const std::string& key) const {
  const double v = cfg_.get_double(key, std::stod(setting(key).def));
  LOOM_CHECK(std::isfinite(v), name(key), " = ", v, " is not a finite number");
  return v;
}

bool RlSettings::flag(const std::string& key) const {
  return cfg_.get_bool(key, false);
}

std::string RlSettings::name(const std::string& key) const {
  const Setting& s = setting(key);
  const std::string where = cfg_.where(key);
  if (where.empty() || where == cat("--", s.flag)) return cat("--", s.flag);
  return cat(key, " (", where, ")");
}

void RlSettings::check_model(const ModelConfig& policy, const std::string& ckpt) const {
  bool any = false;
  for (const std::string& k : cfg_.keys()) any = any || k.rfind("model.", 0) == 0;
  if (!any) return;
  // The keys over the checkpoint's shape (or over the preset they name) must give that shape;
  // otherwise every [model] key given is named.
  const std::string preset = cfg_.get_string("model.preset", "");
  const ModelConfig stated =
      model_config_from(cfg_, preset.empty() ? policy : loom::model_preset(preset));
  if (stated.fingerprint() == policy.fingerprint()) return;
  std::string keys;
  for (const std::string& k : cfg_.keys())
    if (k.rfind("model.", 0) == 0)
      keys += cat(keys.empty() ? "" : ", ", k, " (", cfg_.where(k), ")");
  fail("[model] ", keys, " describes ", stated.fingerprint(), ", but the policy is the checkpoint ",
       ckpt, ": ", policy.fingerprint(), " (loom rl trains the checkpoint's model; [model] may ",
       "only restate it)");
}

void RlSettings::check_all_read() const {
  // A setting that does not apply to this run (--env-timeout without --env http) is ignored, as
  // its flag always was; only keys outside the table can be unknown.
  for (const Setting& s : settings()) cfg_.get_string(s.key, "");
  try {
    cfg_.check_all_used();
  } catch (const Error& e) {
    std::string msg = e.what();
    const size_t q = msg.find("unknown config key '");
    const std::string key =
        q == std::string::npos ? "" : msg.substr(q + 20, msg.find('\'', q + 20) - q - 20);
    const std::string section = key.substr(0, key.find('.'));
    std::string valid;
    for (const Setting& s : settings())
      if (std::string(s.key).rfind(section + ".", 0) == 0)
        valid += cat(valid.empty() ? "" : ", ", s.key);
    for (const char* k : kKeysWithoutFlag)
      if (std::string(k).rfind(section + ".", 0) == 0) valid += cat(valid.empty() ? "" : ", ", k);
    bool trainer = false;
    for (const char* s : kTrainerSections) trainer = trainer || section == s;
    const std::string where = cfg_.where(key);
    if (section == "model") throw;  // check_model read every [model] key
    if (trainer)
      fail(where, ": '", key, "' is a loom train key that loom rl does not honour (loom rl reads ",
           valid, ")");
    fail(msg.substr(0, msg.find(" (keys read")),
         section == "rl" ? cat(" (valid keys: ", valid, ")")
                         : std::string(" (loom rl reads [rl] and loom train's [model], "
                                       "[parallel], [precision], [optim])"));
  }
}

}  // namespace loom::cli
