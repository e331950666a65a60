// `loom rl`'s settings: an [rl] section plus the keys of `loom train`'s [model], [parallel],
// [precision] and [optim] sections that GRPO honours, from --config FILE, --set KEY=VALUE and
// the command-line flags, each of which is an alias of one key (--learner-tp is parallel.tp,
// --steps is rl.steps). The command line overrides the file; a flag and a --set of the same key
// that disagree are refused (neither silently wins).
#pragma once

#include <cstdint>
#include <string>

#include "cli/options.h"
#include "core/config.h"
#include "model/model_config.h"

namespace loom::cli {

class RlSettings {
 public:
  // Declares every setting's flag, --config and --set on `o` (before o.parse()).
  static void declare(Options& o);
  // After o.parse(): the file, then --set, then the flags.
  explicit RlSettings(const Options& o);

  bool given(const std::string& key) const { return cfg_.has(key); }
  // Values with the defaults `--help` shows; Config's errors name the key and where it was set.
  std::string text(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const;
  int integer32(const std::string& key, int lo, int hi) const {
    return static_cast<int>(integer(key, lo, hi));
  }
  double number(const std::string& key) const;  // finite
  bool flag(const std::string& key) const;
  // How a message names a setting: its flag when given as one or not given ("--steps"), else
  // the key and where it was set ("rl.steps (run.toml:4)").
  std::string name(const std::string& key) const;

  const Config& config() const { return cfg_; }
  // [model] may only restate the policy's shape (the checkpoint's): a key that changes it is
  // refused, naming the key.
  void check_model(const ModelConfig& policy, const std::string& ckpt) const;
  // Refuses any key not read: a misspelt [rl] key (listing the valid ones), or a key of
  // loom train's sections that GRPO does not honour (saying so).
  void check_all_read() const;

 private:
  Config cfg_;
};

}  // namespace loom::cli
