// The trainer's checkpoints under damage and crashes: a corrupt or truncated latest checkpoint is
// skipped for the previous one, asynchronous checkpoints hold exactly what synchronous ones hold,
// and a kill -9 during a background write resumes from the previous checkpoint; every resumed run
// ends bit-identical to an uninterrupted one.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "ckpt/checkpoint.h"
#include "ckpt/test_util.h"
#include "core/error.h"
#include "core/fs.h"
#include "temp_dir.h"
#include "train/trainer.h"

extern char** environ;

using namespace loom;
namespace fs = std::filesystem;

namespace {

std::string test_dir(const std::string& name) {
  return loom::test::scoped_dir("ckpt_resilience_" + name);
}

Config tiny_config(const std::string& dir, int steps) {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "a checkpointed fox " + std::to_string(i) + " jumps over the lazy dog.\n";
  write_file_atomic(dir + "/corpus.txt", text);
  Config c = Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 2\nd_model = 32\nn_head = 2\nmax_seq = 32\n"
      "[train]\nmicro_batch = 2\nseq_len = 16\ngrad_accum = 2\nquiet = true\n"
      "peak_gflops = 100\nkeep_last = 3\ncheckpoint_interval = 2\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\n",
      "test.toml");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.out_dir", "\"" + dir + "/run\"", "test");
  c.set("data.paths", "\"" + dir + "/corpus.txt\"", "test");
  return c;
}

std::vector<float> params_of(Trainer& t) {
  auto& P = t.model().params();
  // (read_values: the bf16 policy's 2-byte weights keep no fp32 values; widened from bf16.)
  std::vector<float> v(size_t(P.total()));
  P.read_values(0, P.total(), v.data());
  return v;
}

// The weights of an uninterrupted 6-step run.
std::vector<float> straight_run(const std::string& name) {
  Trainer t(tiny_config(test_dir(name), 6));
  t.run();
  return params_of(t);
}

std::string step_dir(const std::string& dir, int step) {
  return dir + "/run/checkpoints/" + ckpt::step_dir_name(step);
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string& n, const std::string& v) : name(n) {
    ::setenv(n.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

// 64 flipped bytes in the newest checkpoint's model or optimizer file: resume warns, uses the
// checkpoint before it, and the run ends with the weights of a run that never stopped.
TEST(CkptResilience, CorruptOrTruncatedLatestResumesFromThePreviousCheckpoint) {
  const std::vector<float> want = straight_run("straight");
  for (const std::string damage : {"model", "optim", "truncate"}) {
    const std::string d = test_dir("damaged_" + damage);
    Config c = tiny_config(d, 6);
    {
      Trainer t(c);  // checkpoints at 2 and 4, then a "crash"
      for (int i = 0; i < 4; ++i) {
        t.train_step();
        if (t.step() % 2 == 0) t.save_checkpoint();
      }
    }
    const std::string latest = step_dir(d, 4);
    if (damage == "truncate")
      fs::resize_file(latest + "/model.safetensors",
                      fs::file_size(latest + "/model.safetensors") / 2);
    else
      ckpt::testing::flip_data_bytes(latest + "/" + damage + ".safetensors", 64, 11);
    Trainer resumed(c);
    EXPECT_EQ(resumed.step(), 2) << damage;
    resumed.run();
    const std::vector<float> got = params_of(resumed);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << damage;
    // The resumed run wrote a good step 4 over the bad one, and everything verifies now.
    EXPECT_NO_THROW(ckpt::verify_checkpoint(latest)) << damage;
  }
}

// train.ckpt_async: the files are byte-identical to synchronous ones even though training goes
// on (and changes the weights) while the slowed-down write runs, and the run resumes from them
// bit-identically.
TEST(CkptResilience, AsyncCheckpointsEqualSyncOnesAndResumeBitIdentically) {
  const std::string ds = test_dir("sync"), da = test_dir("async");
  {
    Trainer t(tiny_config(ds, 6));
    t.run();
  }
  Config ca = tiny_config(da, 6);
  ca.set("train.ckpt_async", "true", "test");
  {
    ScopedEnv slow("LOOM_TEST_CKPT_WRITE_DELAY_S", "0.3");
    Trainer t(ca);
    t.run();
  }
  for (int step : {2, 4, 6})
    for (const char* f : {"model.safetensors", "optim.safetensors"})
      EXPECT_EQ(read_file(step_dir(ds, step) + "/" + f), read_file(step_dir(da, step) + "/" + f))
          << "step " << step << " " << f;
  // Resume the async run from its step 4 (step 6 removed, as if the run had crashed there).
  std::vector<float> want;
  {
    Trainer t(tiny_config(ds, 6));  // resumes at 6: the final weights
    want = params_of(t);
  }
  remove_all(step_dir(da, 6));
  write_file_atomic(da + "/run/checkpoints/latest", ckpt::step_dir_name(4) + "\n");
  Trainer resumed(ca);
  EXPECT_EQ(resumed.step(), 4);
  resumed.run();
  const std::vector<float> got = params_of(resumed);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
}

// Not a test by itself: the process that CkptResilience.KillDuringBackgroundWrite... starts and
// kills. It saves step 2, then makes the next write slow and trains on.
TEST(CkptResilience, DISABLED_ChildTrainsUntilKilled) {
  const char* dir = std::getenv("LOOM_TEST_CHILD_DIR");
  if (!dir) GTEST_SKIP() << "started by KillDuringBackgroundWriteResumesFromThePreviousCheckpoint";
  Config c = tiny_config(dir, 6);
  c.set("train.ckpt_async", "true", "test");
  Trainer t(c);
  for (int i = 0; i < 2; ++i) t.train_step();
  t.save_checkpoint();
  t.finish_checkpoints();
  ::setenv("LOOM_TEST_CKPT_WRITE_DELAY_S", "60", 1);
  for (int i = 0; i < 2; ++i) t.train_step();
  t.save_checkpoint();  // returns at once; the write sleeps between the two tensor files
  for (int i = 0; i < 2; ++i) t.train_step();
  std::this_thread::sleep_for(std::chrono::seconds(60));  // the parent kills it before this ends
}

TEST(CkptResilience, KillDuringBackgroundWriteResumesFromThePreviousCheckpoint) {
  const std::vector<float> want = straight_run("straight_kill");
  const std::string d = test_dir("killed");
  tiny_config(d, 6);  // writes the corpus
  // The child is this binary again, running only the disabled helper above.
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=CkptResilience.DISABLED_ChildTrainsUntilKilled";
  std::string also = "--gtest_also_run_disabled_tests";
  char* argv[] = {self.data(), filter.data(), also.data(), nullptr};
  ScopedEnv child_dir("LOOM_TEST_CHILD_DIR", d);
  pid_t pid = 0;
  ASSERT_EQ(0, ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, environ));
  // Wait (at most 60 s) until the step-4 write is under way: its model file exists in the
  // temporary directory, and the writer sleeps before the optimizer file.
  const std::string partial = d + "/run/checkpoints/" + ckpt::step_dir_name(4) + ".tmp." +
                              std::to_string(pid) + "/model.safetensors";
  bool started = false;
  for (int i = 0; i < 600 && !started; ++i) {
    started = file_exists(partial);
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(started) << "the child never started writing step 4";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(step_dir(d, 4)));
  EXPECT_EQ(read_file(d + "/run/checkpoints/latest"), ckpt::step_dir_name(2) + "\n");
  ::unsetenv("LOOM_TEST_CHILD_DIR");
  Config c = tiny_config(d, 6);
  c.set("train.ckpt_async", "true", "test");
  Trainer resumed(c);
  EXPECT_EQ(resumed.step(), 2);
  resumed.run();
  const std::vector<float> got = params_of(resumed);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
  EXPECT_FALSE(fs::exists(fs::path(partial).parent_path()))
      << "the dead writer's temporary directory was not cleaned up";
}

TEST(CkptResilience, BadCheckpointTimeoutIsAConfigError) {
  Config c = tiny_config(test_dir("timeout"), 2);
  c.set("train.ckpt_timeout", "0", "test");
  try {
    Trainer t(c);
    ADD_FAILURE() << "train.ckpt_timeout = 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.ckpt_timeout"), std::string::npos) << e.what();
  }
}
