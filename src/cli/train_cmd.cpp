// `loom train`: a config file plus command-line overrides -> a trained model and checkpoints.
#include "cli/command.h"
#include "cli/options.h"
#include "core/config.h"
#include "train/device.h"
#include "train/trainer.h"

namespace loom::cli {

int run_train(const Args& args) {
  Options o("loom train [--config FILE] [--set section.key=value ...] [--device D]",
            "Trains a GPT-2 or Llama-style decoder. Settings come from the config file (TOML:\n"
            "[model], [data], [train], [optim], [precision]; see docs/training.md), then from\n"
            "--set overrides. Unknown keys are errors. Resumes from <train.out_dir>/checkpoints\n"
            "when a checkpoint exists there. Metrics go to <train.out_dir>/metrics.jsonl.");
  o.value("config", "", "TOML config file (optional: defaults train the tiny preset)")
      .multi("set", "override one setting, e.g. --set optim.lr=1e-3")
      .value("device", "", "cpu, cuda or auto: train.device (overrides the config)");
  if (!o.parse(args)) return 0;
  // The flag as typed is checked first, so its error names --device.
  if (!o.get("device").empty()) check_device(o.get("device"), "--device");
  Config cfg = o.get("config").empty() ? Config() : Config::load(o.get("config"));
  for (auto& s : o.all("set")) cfg.set_override(s, "--set");
  if (!o.get("device").empty()) {
    std::string quoted = "\"";  // a TOML string (built in steps: GCC 12's -Wrestrict misfires)
    quoted += o.get("device");
    quoted += '"';
    cfg.set("train.device", quoted, "--device");
  }
  Trainer trainer(cfg);
  trainer.run();
  return 0;
}

}  // namespace loom::cli
