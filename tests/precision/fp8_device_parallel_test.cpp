// The fp8 recipes on a device under pipeline and expert parallelism, proven on 2 MPI ranks without
// a GPU: each rank trains over the guarded CPU backend (its buffers fault on host access) with
// the fp8 stand-in recipe (tests/precision/guarded_fp8_recipes.h: delayed scaling's state on the
// device, the CPU recipe's GEMMs), its groups exchanging device memory through the staged
// communicator. Per layout and recipe, three steps, an evaluation and a checkpoint, then a new
// trainer that resumes and trains three more, must equal six straight steps of the same layout
// on the plain CPU trainer (the CPU recipe) bit for bit: losses, gradient norms, validation
// losses and this rank's final weights.
//
// What would make them differ: a stage attaching other layers than the CPU recipe's, delayed
// scaling's amaxes reduced over the wrong group (under EP the two ranks are data-parallel over
// the attention layers, and their batches differ, so a missing max-reduction changes the
// scales), an evaluation that recorded amaxes, or a checkpoint that lost the histories. A stage
// whose blocks all stay bf16 (fp8_keep_last) holds an empty state.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/guarded_backend.h"
#include "mpi_main.h"
#include "parallel/trainer_fixture.h"
#include "precision/guarded_fp8_recipes.h"
#include "same_bits.h"
#include "train/trainer.h"

using namespace loom;
using loom::testing_parallel::W;

namespace {

const testing_parallel::TrainerRuns runs{"fp8devpar", "an fp8 pipelined fox "};

struct Layout {
  const char* name;
  const char* preset;
  std::vector<std::pair<std::string, std::string>> keys;
  int n_layer = 2;
};

const char* kRecipes[] = {"fp8_tensorwise_delayed", "fp8_tensorwise_current", "mxfp8"};

Config config(const std::string& dir, const Layout& l, const std::string& recipe) {
  Config c = testing_parallel::tiny_run_config(dir, runs.line_start, l.n_layer, "5e-3", 6, 2);
  c.set("model.preset", std::string("\"") + l.preset + "\"", "test");
  c.set("train.eval_interval", "3", "test");
  c.set("train.eval_batches", "2", "test");
  c.set("train.checkpoint_interval", "3", "test");
  c.set("train.tensorboard", "false", "test");
  c.set("precision.fp8_recipe", "\"" + recipe + "\"", "test");
  c.set("precision.fp8_format", "\"hybrid\"", "test");
  // A short history that wraps within the six steps.
  if (recipe == "fp8_tensorwise_delayed") c.set("precision.fp8_amax_history", "2", "test");
  for (const auto& [k, v] : l.keys) c.set(k, v, "test");
  return c;
}

struct Run {
  std::vector<double> loss, grad_norm, valid;
  std::vector<float> values;
  int64_t resumed_at = -1;
};

void record(Run& r, Trainer& t) {
  for (int i = 0; i < 3; ++i) {
    const StepResult s = t.train_step();
    r.loss.push_back(s.loss);
    r.grad_norm.push_back(s.grad_norm);
  }
  r.valid.push_back(t.evaluate());
}

std::vector<float> weights(Trainer& t) {
  const ParamSet& P = t.model().params();
  std::vector<float> v(size_t(P.total()));
  P.read_values(0, P.total(), v.data());
  return v;
}

void expect_matches(const Layout& l, const std::string& recipe) {
  SCOPED_TRACE(cat(l.name, " ", recipe));
  // The CPU recipe's bf16 GEMMs on one summation order in both runs.
  setenv("LOOM_BF16_GEMM", "fallback", 1);
  const std::string name = cat(l.name, "_", recipe);
  Run want, got;
  {
    Trainer t(config(runs.dir(name + "_cpu"), l, recipe));
    record(want, t);
    record(want, t);
    want.values = weights(t);
  }
  test::GuardedBackend g;
  g.set_strict(true);
  test::GuardedFp8Recipes::Registration stand_in(g);
  const Config c = config(runs.dir(name + "_dev"), l, recipe);
  {
    Trainer t(c, nullptr, &g);
    record(got, t);
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  {
    Trainer t(c, nullptr, &g);
    got.resumed_at = t.step();
    record(got, t);
    got.values = weights(t);
  }
  EXPECT_EQ(got.resumed_at, 3);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.grad_norm, want.grad_norm);
  EXPECT_EQ(got.valid, want.valid);
  EXPECT_TRUE(test::same_bits(got.values, want.values))
      << "final weights differ on rank " << W().rank();
  for (const std::string& op :
       std::set<std::string>(g.host_pointer_ops().begin(), g.host_pointer_ops().end()))
    ADD_FAILURE() << "host memory given to " << op;
  // The device recipe really ran: one per trainer, a begin_step per step, fp8 GEMMs on every
  // rank (a stage with no fp8 layer runs none).
  EXPECT_EQ(stand_in.counts.recipes, 2);
  EXPECT_EQ(stand_in.counts.steps, 6);
  EXPECT_GT(W().all_reduce_scalar(double(stand_in.counts.gemms), comm::ReduceOp::Max), 0.0);
  EXPECT_GT(g.ops(), 500);
  EXPECT_NE(want.loss.front(), want.loss.back()) << "the model did not train";
}

}  // namespace

// One pipeline stage per rank; delayed scaling with the last block in bf16, so stage 1 holds no
// fp8 layer (an empty state, checkpointed and restored as the CPU recipe's).
TEST(Fp8DeviceParallel, PipelineDelayedWithABf16StageEqualsCpuRun) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_matches({"pp_keep", "tiny", {{"parallel.pp", "2"}, {"precision.fp8_keep_last", "1"}}},
                 kRecipes[0]);
}

// Interleaved 1F1B, two virtual stages per rank: each rank's recipe holds two chunks' layers.
TEST(Fp8DeviceParallel, PipelineWithVirtualStagesEqualsCpuRunForEachRecipe) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  for (const char* r : kRecipes)
    expect_matches(
        {"pp",
         "tiny",
         {{"parallel.pp", "2"}, {"parallel.vp", "2"}, {"parallel.pp_schedule", "\"interleaved\""}},
         4},
        r);
}

// Experts split over the two ranks (which are data-parallel for everything else): the experts'
// MLPs take no recipe (as on the CPU), the attention layers' delayed amaxes are max-reduced over
// both ranks.
TEST(Fp8DeviceParallel, ExpertParallelEqualsCpuRunForEachRecipe) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  for (const char* r : kRecipes) expect_matches({"ep", "tiny-moe", {{"parallel.ep", "2"}}}, r);
}

LOOM_MPI_TEST_MAIN()
