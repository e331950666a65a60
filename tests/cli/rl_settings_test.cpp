// `loom rl`'s settings (src/cli/rl_settings.h): a flag is its key, a file and --set give the
// same values, the command line overrides the file, a flag and a --set that disagree are
// refused, and keys GRPO does not read are refused by name.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "cli/rl_settings.h"
#include "core/error.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::cli;

namespace {

// The settings of `loom rl` with these arguments.
RlSettings parse(const Args& args) {
  Options o("loom rl", "");
  RlSettings::declare(o);
  EXPECT_TRUE(o.parse(args));
  return RlSettings(o);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every kind of setting: a value, a number, an integer, a boolean flag, trainer sections.
void expect_the_same(const RlSettings& a, const RlSettings& b) {
  EXPECT_EQ(a.integer("rl.steps", 1, 1000), b.integer("rl.steps", 1, 1000));
  EXPECT_EQ(a.integer("parallel.tp", 1, 64), b.integer("parallel.tp", 1, 64));
  EXPECT_EQ(a.flag("parallel.sp"), b.flag("parallel.sp"));
  EXPECT_EQ(a.number("optim.lr"), b.number("optim.lr"));
  EXPECT_EQ(a.flag("rl.async"), b.flag("rl.async"));
  EXPECT_EQ(a.text("rl.env"), b.text("rl.env"));
  EXPECT_EQ(a.number("rl.eps_high"), b.number("rl.eps_high"));
}

}  // namespace

TEST(RlSettings, FlagsAreAliasesOfKeys) {
  test::TempDir dir("rl_settings");
  const std::string file = dir.path + "/rl.toml";
  std::ofstream(file) << "[rl]\nsteps = 7\nasync = true\nenv = \"countdown\"\neps_high = 0.3\n"
                         "[parallel]\ntp = 2\nsp = true\n[optim]\nlr = 3e-4\n";
  const RlSettings flags = parse({"--steps", "7", "--async", "--env", "countdown", "--eps-high",
                                  "0.3", "--learner-tp", "2", "--learner-sp", "--lr", "3e-4"});
  const RlSettings keys =
      parse({"--set", "rl.steps=7", "--set", "rl.async=true", "--set", "rl.env=countdown", "--set",
             "rl.eps_high=0.3", "--set", "parallel.tp=2", "--set", "parallel.sp=true", "--set",
             "optim.lr=3e-4"});
  const RlSettings from_file = parse({"--config", file});
  expect_the_same(flags, keys);
  expect_the_same(flags, from_file);
  EXPECT_EQ(flags.integer("rl.steps", 1, 1000), 7);
  EXPECT_EQ(flags.integer("parallel.tp", 1, 64), 2);
  EXPECT_DOUBLE_EQ(flags.number("optim.lr"), 3e-4);
  // Nothing given: the defaults --help shows.
  const RlSettings none = parse({});
  EXPECT_EQ(none.integer("rl.steps", 1, 1000), 20);
  EXPECT_DOUBLE_EQ(none.number("optim.lr"), 1e-5);
  EXPECT_FALSE(none.flag("rl.async"));
  EXPECT_FALSE(none.given("parallel.tp"));
  EXPECT_TRUE(flags.given("parallel.tp"));
}

TEST(RlSettings, CommandLineOverridesTheFileAndDisagreementIsRefused) {
  test::TempDir dir("rl_settings");
  const std::string file = dir.path + "/rl.toml";
  std::ofstream(file) << "[rl]\nsteps = 7\n";
  EXPECT_EQ(parse({"--config", file, "--steps", "3"}).integer("rl.steps", 1, 1000), 3);
  EXPECT_EQ(parse({"--config", file, "--set", "rl.steps=4"}).integer("rl.steps", 1, 1000), 4);
  // The same value in two spellings is no disagreement.
  EXPECT_DOUBLE_EQ(parse({"--lr", "1e-5", "--set", "optim.lr=0.00001"}).number("optim.lr"), 1e-5);
  const std::string e = error_of([] { parse({"--learner-tp", "2", "--set", "parallel.tp=4"}); });
  EXPECT_NE(e.find("--learner-tp 2 and --set parallel.tp=4 disagree"), std::string::npos) << e;
}

TEST(RlSettings, MessagesNameTheSettingAsItWasGiven) {
  test::TempDir dir("rl_settings");
  const std::string file = dir.path + "/rl.toml";
  std::ofstream(file) << "[rl]\nsteps = 7\n";
  EXPECT_EQ(parse({"--steps", "3"}).name("rl.steps"), "--steps");
  EXPECT_EQ(parse({}).name("rl.steps"), "--steps");
  EXPECT_EQ(parse({"--config", file}).name("rl.steps"), "rl.steps (" + file + ":2)");
  // Range errors name the key and where it was set.
  const std::string e = error_of([] { parse({"--steps", "0"}).integer("rl.steps", 1, 1000); });
  EXPECT_NE(e.find("'rl.steps'"), std::string::npos) << e;
  EXPECT_NE(e.find("--steps"), std::string::npos) << e;
}

TEST(RlSettings, KeysNotReadAreRefusedByName) {
  std::string e = error_of([] { parse({"--set", "rl.stpes=3"}).check_all_read(); });
  EXPECT_NE(e.find("unknown config key 'rl.stpes'"), std::string::npos) << e;
  EXPECT_NE(e.find("valid keys: rl.ckpt, rl.env"), std::string::npos) << e;
  // loom train keys GRPO does not honour: said so, with what loom rl reads in that section.
  e = error_of([] { parse({"--set", "parallel.bucket_mb=8"}).check_all_read(); });
  EXPECT_NE(e.find("'parallel.bucket_mb' is a loom train key that loom rl does not honour"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("parallel.tp, parallel.sp, parallel.ep, parallel.etp"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.zero, parallel.grad_reduce_dtype"), std::string::npos) << e;
  e = error_of([] { parse({"--set", "optim.schedule=wsd"}).check_all_read(); });
  EXPECT_NE(e.find("'optim.schedule' is a loom train key"), std::string::npos) << e;
  e = error_of([] { parse({"--set", "train.steps=3"}).check_all_read(); });
  EXPECT_NE(e.find("unknown config key 'train.steps'"), std::string::npos) << e;
  EXPECT_NE(e.find("loom rl reads [rl]"), std::string::npos) << e;
  // Every setting the table declares is read, given or not (a setting that does not apply to a
  // run is ignored, as its flag always was).
  EXPECT_EQ(error_of([] { parse({"--env-timeout", "3", "--seed", "2"}).check_all_read(); }), "");
}

TEST(RlSettings, ModelMayOnlyRestateThePolicy) {
  const ModelConfig tiny = model_preset("tiny");
  EXPECT_EQ(error_of([&] {
              RlSettings s = parse({"--set", "model.preset=tiny", "--set", "model.n_layer=4"});
              s.check_model(tiny, "ck");
              s.check_all_read();
            }),
            "");
  const std::string e = error_of([&] {
    parse({"--set", "model.n_layer=8"}).check_model(tiny, "runs/sft/checkpoints");
  });
  EXPECT_NE(e.find("[model] model.n_layer (--set)"), std::string::npos) << e;
  EXPECT_NE(e.find("the policy is the checkpoint runs/sft/checkpoints"), std::string::npos) << e;
}
