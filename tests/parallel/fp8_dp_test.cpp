// FP8 recipes under data parallelism, through the trainer: DP = world (each rank A micro-batches)
// against one process with the same global batch (A x DP micro-batches, the same ones: the loader
// gives DP rank r the micro-batches one process reads in turn). Losses agree within the DP parity
// tests' 1e-5 for every recipe. Delayed scaling max-reduces its step amaxes over the DP ranks
// (Transformer Engine's amax reduction group), so after the first step every rank's history equals
// one process's bit for bit (the first step's amaxes come from identical weights); without the
// reduction a rank would keep the amax of its own micro-batches only and these checks fail.
// Current scaling and MXFP8 need no reduction: their scales are per micro-batch, as one
// process's.
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "mpi_main.h"
#include "parity_util.h"
#include "precision/fp8_recipes.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace loom;
using loom::testing_parallel::rel_diff;
using loom::testing_parallel::W;

namespace {

const testing_parallel::TrainerRuns runs{"fp8dp", "an fp8 fox "};

Config config(const std::string& dir, int steps, int grad_accum, const char* recipe,
              const char* format) {
  Config c = runs.config(dir, steps, grad_accum, "tiny");
  c.set("precision.policy", "\"bf16\"", "test");
  c.set("precision.fp8_recipe", std::string("\"") + recipe + "\"", "test");
  c.set("precision.fp8_format", std::string("\"") + format + "\"", "test");
  return c;
}

void check_fp8_dp(const char* recipe, const char* format) {
  const int D = W().size(), A = 2, steps = 6;
  auto self = comm::make_self_communicator();
  Trainer ref(config(runs.dir("ref"), steps, A * D, recipe, format), self.get());
  Trainer t(config(runs.dir("dp"), steps, A, recipe, format));
  ASSERT_TRUE(t.distributed());
  ASSERT_EQ(t.groups()->dp().size(), D);
  const bool delayed = std::string(recipe) == "fp8_tensorwise_delayed";
  for (int i = 0; i < steps; ++i) {
    const double a = ref.train_step().loss, b = t.train_step().loss;
    EXPECT_LT(rel_diff(a, b), 1e-5) << recipe << " step " << i << ": " << b << " vs " << a;
    if (!delayed || i == 0) continue;
    // The history's oldest entry: step 0's amaxes, joined at the start of step 1.
    for (const std::string& n : ref.fp8_recipes()->names())
      for (auto k : {Fp8Linear::X, Fp8Linear::W, Fp8Linear::DY}) {
        const auto h1 = ref.fp8_recipes()->get(n)->history(k);
        const auto h2 = t.fp8_recipes()->get(n)->history(k);
        ASSERT_EQ(h1.size(), h2.size()) << n;
        ASSERT_EQ(h1.front(), h2.front()) << n << " tensor " << k << " step " << i;
      }
  }
}

TEST(Fp8DataParallel, CurrentScaling) {
  check_fp8_dp("fp8_tensorwise_current", "e4m3");
}
TEST(Fp8DataParallel, DelayedScalingSharesAmaxes) {
  check_fp8_dp("fp8_tensorwise_delayed", "hybrid");
}
TEST(Fp8DataParallel, Mxfp8) {
  check_fp8_dp("mxfp8", "e4m3");
}

}  // namespace

LOOM_MPI_TEST_MAIN()
