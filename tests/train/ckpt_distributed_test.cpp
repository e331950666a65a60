// Distributed checkpoints on 2 MPI ranks: a step counts only with its global commit record, so a
// partial step (a rank killed during the save) is ignored on resume, not blamed on the world
// size; a part that fails verification on one rank sends every rank back to the step before; and
// the resumed run is bit-identical to one that never stopped, with synchronous and asynchronous
// checkpoints alike.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/global_commit.h"
#include "ckpt/test_util.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/fs.h"
#include "mpi_main.h"
#include "parallel/trainer_fixture.h"
#include "train/trainer.h"

using namespace loom;
using loom::testing_parallel::W;
namespace fs = std::filesystem;

namespace {

const testing_parallel::TrainerRuns runs{"ckpt_dist", "a committed fox "};

Config config(const std::string& dir, bool async) {
  Config c = testing_parallel::tiny_run_config(dir, runs.line_start, 2, "1e-2", 6, 1);
  c.set("model.preset", "\"tiny\"", "test");
  c.set("parallel.zero", "1", "test");
  c.set("train.ckpt_async", async ? "true" : "false", "test");
  return c;
}

std::vector<double> straight_losses() {
  Trainer t(config(runs.dir("straight"), false));
  std::vector<double> out;
  for (int i = 0; i < 6; ++i) out.push_back(t.train_step().loss);
  return out;
}

// Checkpoints at steps 2 and 4, both committed on every rank.
void train_to_4(const Config& c) {
  Trainer t(c);
  for (int i = 0; i < 4; ++i) {
    t.train_step();
    if (t.step() % 2 == 0) t.save_checkpoint();
  }
  t.finish_checkpoints();
}

std::string part(const std::string& dir, int step) {
  return dir + "/run/checkpoints/" + ckpt::rank_dir_name(W().rank()) + "/" +
         ckpt::step_dir_name(step);
}
std::string record(const std::string& dir, int step) {
  return ckpt::global_commit_dir(dir + "/run/checkpoints") + "/" + ckpt::step_dir_name(step) +
         ".json";
}

// Resumes `c`, expects `step`, and trains to 6 with the straight run's losses.
void expect_resumes_at(const Config& c, int64_t step, const std::vector<double>& want,
                       const std::string& label) {
  Trainer t(c);
  ASSERT_EQ(t.step(), step) << label;
  for (int64_t s = step; s < 6; ++s) EXPECT_EQ(t.train_step().loss, want[size_t(s)]) << label << s;
}

}  // namespace

TEST(CkptDistributed, StepsAreCommittedOnlyWhenEveryRanksPartIs) {
  const std::vector<double> want = straight_losses();
  for (bool async : {false, true}) {
    const std::string label = async ? "async, step " : "sync, step ";
    const std::string d = runs.dir(async ? "partial_async" : "partial_sync");
    train_to_4(config(d, async));
    if (W().rank() == 0) {
      EXPECT_TRUE(file_exists(record(d, 2))) << label;
      EXPECT_TRUE(file_exists(record(d, 4))) << label;
    }
    // Rank 1 was killed while writing step 4: its part is missing and rank 0 never wrote the
    // global record. Rank 0's part of step 4 is complete.
    if (W().rank() == 1) remove_all(part(d, 4));
    if (W().rank() == 0) remove_all(record(d, 4));
    W().barrier();
    expect_resumes_at(config(d, async), 2, want, label);
  }
}

TEST(CkptDistributed, PartialFirstCheckpointStartsFreshInsteadOfFailing) {
  const std::string d = runs.dir("first");
  {
    Trainer t(config(d, false));
    for (int i = 0; i < 2; ++i) t.train_step();
    t.save_checkpoint();
  }
  if (W().rank() == 1) remove_all(part(d, 2));
  if (W().rank() == 0) remove_all(record(d, 2));
  W().barrier();
  Trainer t(config(d, false));  // before: "was the run started with another world size?"
  EXPECT_EQ(t.step(), 0);
}

TEST(CkptDistributed, CorruptPartOnOneRankSendsEveryRankBackAStep) {
  const std::vector<double> want = straight_losses();
  const std::string d = runs.dir("corrupt");
  train_to_4(config(d, false));
  if (W().rank() == 1) ckpt::testing::flip_data_bytes(part(d, 4) + "/model.safetensors", 64, 5);
  W().barrier();
  expect_resumes_at(config(d, false), 2, want, "corrupt part, step ");
}

TEST(CkptDistributed, AnotherWorldSizeIsNamedOnEveryRank) {
  const std::string d = runs.dir("world");
  train_to_4(config(d, false));
  if (W().rank() == 0) {
    ckpt::GlobalCommit gc = *ckpt::read_global_commit(d + "/run/checkpoints", 4);
    gc.parts.push_back(gc.parts.back());  // as if written by a 3-rank run
    ckpt::write_global_commit(d + "/run/checkpoints", gc);
  }
  W().barrier();
  try {
    Trainer t(config(d, false));
    ADD_FAILURE() << "resumed a 3-rank step on " << W().size() << " ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 4 was committed by 3 ranks, but this run has 2"),
              std::string::npos)
        << e.what();
  }
}

LOOM_MPI_TEST_MAIN()
