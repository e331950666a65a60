// The fp8 recipes on a device under tensor, pipeline and expert parallelism, proven on 2 MPI
// ranks without a GPU: each rank trains over the guarded CPU backend (its buffers fault on host
// access) with the fp8 stand-in recipe (tests/precision/guarded_fp8_recipes.h: delayed scaling's
// state on the device, current scaling's scales derived there from TP-reduced amaxes, the CPU
// recipe's GEMMs), its groups exchanging device memory through the staged communicator. Per
// layout and recipe, three steps, an evaluation and a checkpoint, then a new trainer that resumes
// and trains three more, must equal six straight steps of the same layout on the plain CPU
// trainer (the CPU recipe) bit for bit (tests/train/device_layouts.h): losses, gradient norms,
// validation losses and this rank's final weights.
//
// What would make them differ: a stage attaching other layers than the CPU recipe's, delayed
// scaling's amaxes reduced over the wrong group (under EP the two ranks are data-parallel over
// the attention layers, and their batches differ, so a missing max-reduction changes the
// scales), current scaling's amaxes not reduced over the TP group (each rank holds half of a
// split weight, dy or x, whose halves' amaxes differ), an evaluation that recorded amaxes, or a
// checkpoint that lost the histories. A stage whose blocks all stay bf16 (fp8_keep_last) holds
// an empty state.
#include <gtest/gtest.h>

#include <string>

#include "comm/communicator.h"
#include "kernels/guarded_backend.h"
#include "mpi_main.h"
#include "precision/guarded_fp8_recipes.h"
#include "train/device_layouts.h"

using namespace loom;
using namespace loom::testing_parallel;

namespace {

const TrainerRuns runs{"fp8devpar", "an fp8 pipelined fox "};

const char* kRecipes[] = {"fp8_tensorwise_delayed", "fp8_tensorwise_current", "mxfp8"};

Config config(const std::string& dir, const Layout& l, const std::string& recipe) {
  Config c = layout_config(runs, dir, l);
  c.set("precision.fp8_recipe", "\"" + recipe + "\"", "test");
  c.set("precision.fp8_format", "\"hybrid\"", "test");
  // A short history that wraps within the six steps.
  if (recipe == "fp8_tensorwise_delayed") c.set("precision.fp8_amax_history", "2", "test");
  return c;
}

void expect_matches(const Layout& l, const std::string& recipe) {
  SCOPED_TRACE(cat(l.name, " ", recipe));
  use_fallback_bf16_gemm();
  const std::string name = cat(l.name, "_", recipe);
  const LayoutRun want = cpu_layout_run(config(runs.dir(name + "_cpu"), l, recipe));
  test::GuardedBackend g;
  g.set_strict(true);
  test::GuardedFp8Recipes::Registration stand_in(g);
  const LayoutRun got = guarded_layout_run(config(runs.dir(name + "_dev"), l, recipe), g);
  expect_same_run(want, got, g, 500);
  // The device recipe really ran: one per trainer, a begin_step per step, fp8 GEMMs on every
  // rank (a stage with no fp8 layer runs none).
  EXPECT_EQ(stand_in.counts.recipes, 2);
  EXPECT_EQ(stand_in.counts.steps, 6);
  EXPECT_GT(W().all_reduce_scalar(double(stand_in.counts.gemms), comm::ReduceOp::Max), 0.0);
}

}  // namespace

// Tensor parallelism: every linear split over the two ranks. Current scaling max-reduces each
// amax over the TP group's device communicator before deriving the scale (as the CPU recipe and
// Transformer Engine do); delayed scaling's step reduction spans TP x DP; MX needs none.
TEST(Fp8DeviceParallel, TensorParallelEqualsCpuRunForEachRecipe) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  for (const char* r : kRecipes) expect_matches({"tp", "tiny", {{"parallel.tp", "2"}}}, r);
}

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
         2,
         "fp32",
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
