// The loss guard in the trainer (train.on_spike): an injected loss spike rolls the run back to its
// last checkpoint and it trains on to the end, one metrics row per step; "stop" fails naming the
// step and writes no checkpoint of it; a run that keeps failing stops after train.max_rollbacks
// with its last good checkpoint intact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "temp_dir.h"
#include "train/trainer.h"

using namespace loom;

namespace {

Config tiny_config(const std::string& dir, int steps, const std::string& on_spike) {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "a guarded fox " + std::to_string(i) + " jumps over the lazy dog.\n";
  write_file_atomic(dir + "/corpus.txt", text);
  Config c = Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 2\nd_model = 32\nn_head = 2\nmax_seq = 32\n"
      "[train]\nmicro_batch = 2\nseq_len = 16\ngrad_accum = 2\nquiet = true\n"
      "peak_gflops = 100\nkeep_last = 2\ncheckpoint_interval = 3\nspike_window = 4\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\n",
      "test.toml");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.on_spike", "\"" + on_spike + "\"", "test");
  c.set("train.out_dir", "\"" + dir + "/run\"", "test");
  c.set("data.paths", "\"" + dir + "/corpus.txt\"", "test");
  return c;
}

struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string& n, const std::string& v) : name(n) {
    ::setenv(n.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

// step -> loss of each training row of metrics.jsonl, failing on a step seen twice.
std::map<int64_t, double> loss_rows(const std::string& dir) {
  std::ifstream in(dir + "/run/metrics.jsonl");
  std::map<int64_t, double> rows;
  for (std::string line; std::getline(in, line);) {
    Json j = Json::parse(line);
    if (!j.contains("loss")) continue;
    int64_t s = j.at("step").as_int();
    EXPECT_EQ(rows.count(s), 0u) << "step " << s << " has two rows";
    rows[s] = j.at("loss").as_double();
  }
  return rows;
}

std::string error_of(Trainer& t) {
  try {
    t.run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LossGuardTrainer, SpikeRollsBackToTheLastCheckpointAndTheRunFinishes) {
  test::TempDir straight_dir("rollback_straight");
  Trainer straight(tiny_config(straight_dir.path, 12, "rollback"));
  straight.run();
  EXPECT_EQ(straight.rollbacks(), 0);
  test::TempDir tmp("rollback");
  ScopedEnv spike("LOOM_TEST_LOSS_SPIKE", "8:50");  // step 8's loss x 50
  Trainer t(tiny_config(tmp.path, 12, "rollback"));
  t.run();
  EXPECT_EQ(t.step(), 12);
  EXPECT_EQ(t.rollbacks(), 1);
  auto rows = loss_rows(tmp.path);
  ASSERT_EQ(rows.size(), 12u);
  for (auto& [s, loss] : rows) EXPECT_LT(loss, 20.0) << "step " << s;  // the spike row is gone
  // Rolled back to step 6 with steps 7 and 8's data skipped: the weights are not those of a run
  // that never spiked (which would train on that data).
  auto& a = t.model().params();
  auto& b = straight.model().params();
  EXPECT_FALSE(std::equal(a.data(), a.data() + a.total(), b.data()));
  EXPECT_EQ(ckpt::Checkpoint(tmp.path + "/run/checkpoints").state().step, 12);
}

TEST(LossGuardTrainer, StopFailsNamingTheStepAndWritesNoCheckpointOfIt) {
  test::TempDir tmp("spike_stop");
  ScopedEnv spike("LOOM_TEST_LOSS_SPIKE", "9:50");  // step 9 is also a checkpoint step
  Trainer t(tiny_config(tmp.path, 12, "stop"));
  std::string err = error_of(t);
  EXPECT_NE(err.find("stopping: step 9: loss"), std::string::npos) << err;
  EXPECT_NE(err.find("spiked above"), std::string::npos) << err;
  EXPECT_NE(err.find("train.on_spike = stop"), std::string::npos) << err;
  EXPECT_EQ(ckpt::Checkpoint(tmp.path + "/run/checkpoints").state().step, 6);
  EXPECT_FALSE(file_exists(tmp.path + "/run/checkpoints/" + ckpt::step_dir_name(9)));
}

// Non-finite gradients on every step: each rollback meets them again; after max_rollbacks the run
// stops and the newest checkpoint is still the good one it rolled back to.
TEST(LossGuardTrainer, RepeatedDivergenceStopsAfterMaxRollbacks) {
  test::TempDir tmp("rollback_limit");
  {
    Trainer first(tiny_config(tmp.path, 3, "rollback"));
    first.run();
  }
  Config c = tiny_config(tmp.path, 12, "rollback");
  c.set("train.max_bad_steps", "2", "test");
  c.set("train.max_rollbacks", "2", "test");
  Trainer t(c);
  ASSERT_EQ(t.step(), 3);
  t.inject_gradient_factor(NAN);
  std::string err = error_of(t);
  EXPECT_EQ(t.rollbacks(), 2);
  EXPECT_NE(err.find("2 consecutive steps skipped"), std::string::npos) << err;
  EXPECT_NE(err.find("already rolled back 2 time(s) (train.max_rollbacks = 2)"), std::string::npos)
      << err;
  ckpt::Checkpoint latest(tmp.path + "/run/checkpoints");
  EXPECT_EQ(latest.state().step, 3);
}

TEST(LossGuardTrainer, RollbackWithoutACheckpointIsAnError) {
  test::TempDir tmp("rollback_none");
  ScopedEnv spike("LOOM_TEST_LOSS_SPIKE", "6:50");
  Config c = tiny_config(tmp.path, 8, "rollback");
  c.set("train.checkpoint_interval", "0", "test");
  Trainer t(c);
  std::string err = error_of(t);
  EXPECT_NE(err.find("step 6: loss"), std::string::npos) << err;
  EXPECT_NE(err.find("no checkpoint to roll back to"), std::string::npos) << err;
}
