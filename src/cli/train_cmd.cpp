// `loom train`: a config file plus command-line overrides -> a trained model and checkpoints.
#include "cli/command.h"
#include "cli/options.h"
#include "core/config.h"
#include "train/trainer.h"

namespace loom::cli {

int run_train(const Args& args) {
  Options o("loom train [--config FILE] [--set section.key=value ...]",
            "Trains a GPT-2 or Llama-style decoder. Settings come from the config file (TOML:\n"
            "[model], [data], [train], [optim], [precision]; see docs/training.md), then from\n"
            "--set overrides. Unknown keys are errors. Resumes from <train.out_dir>/checkpoints\n"
            "when a checkpoint exists there. Metrics go to <train.out_dir>/metrics.jsonl.");
  o.value("config", "", "TOML config file (optional: defaults train the tiny preset)")
      .multi("set", "override one setting, e.g. --set optim.lr=1e-3");
  if (!o.parse(args)) return 0;
  Config cfg = o.get("config").empty() ? Config() : Config::load(o.get("config"));
  for (auto& s : o.all("set")) cfg.set_override(s, "--set");
  Trainer trainer(cfg);
  trainer.run();
  return 0;
}

}  // namespace loom::cli
