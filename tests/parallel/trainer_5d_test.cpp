// The 8-rank layout combinations (DP, TP, PP, CP, EP) through the trainer (`loom train`'s code path), each
// against a single-process trainer on the same global batch for 10 steps (losses and grad
// norms within 1e-5 relative): TP2 x PP2 x DP2 (with SP and ZeRO-1), TP2 x CP2 x DP2 (ZeRO-1),
// and PP2 x EP2 x DP2 for a MoE model with ZeRO-1 (aux loss compared too).
#include <gtest/gtest.h>

#include <string>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "core/fs.h"
#include "mpi_main.h"
#include "parity_util.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace loom;
using loom::testing_parallel::rel_diff;
using loom::testing_parallel::W;

namespace {

const testing_parallel::TrainerRuns runs{"5d", "a five-dimensional fox "};

void check_combo(const char* family, const std::vector<std::pair<const char*, std::string>>& set,
                 int dp, bool moe) {
  const int A = 2, steps = 10;
  auto extra = [&](Config& c) {
    if (!moe) return;
    c.set("model.n_experts", "4", "test");
    c.set("model.aux_loss_coeff", "0.02", "test");
  };
  std::string dr = runs.dir("ref");
  auto self = comm::make_self_communicator();
  Config rc = runs.config(dr, steps, A * dp, family);
  extra(rc);
  Trainer ref(rc, self.get());
  std::string d = runs.dir("combo");
  Config c = runs.config(d, steps, A, family);
  extra(c);
  for (const auto& [k, v] : set) c.set(k, v, "test");
  Trainer t(c);
  EXPECT_EQ(t.groups()->dp().size(), dp);
  for (int i = 0; i < steps; ++i) {
    StepResult a = ref.train_step(), b = t.train_step();
    EXPECT_LT(rel_diff(b.loss, a.loss), 1e-5) << "step " << i << ": " << b.loss << " vs " << a.loss;
    EXPECT_LT(rel_diff(b.grad_norm, a.grad_norm), 1e-5) << "grad norm, step " << i;
    if (moe) {
      EXPECT_LT(rel_diff(b.aux_loss, a.aux_loss), 1e-5) << "aux loss, step " << i;
    }
  }
}

}  // namespace

TEST(Trainer5d, Tp2Pp2Dp2SequenceParallelZero1) {
  if (W().size() != 8) GTEST_SKIP() << "needs 8 ranks";
  check_combo(
      "tiny",
      {{"parallel.tp", "2"}, {"parallel.sp", "true"}, {"parallel.pp", "2"}, {"parallel.zero", "1"}},
      2, false);
}
TEST(Trainer5d, Tp2Cp2Dp2Zero1) {
  if (W().size() != 8) GTEST_SKIP() << "needs 8 ranks";
  check_combo("tiny-llama", {{"parallel.tp", "2"}, {"parallel.cp", "2"}, {"parallel.zero", "1"}}, 2,
              false);
}
TEST(Trainer5d, Pp2Ep2Dp2MoeZero1) {
  if (W().size() != 8) GTEST_SKIP() << "needs 8 ranks";
  // EP splits data parallelism: dp = 4 = ep 2 x expert-data-parallel 2.
  check_combo("tiny", {{"parallel.pp", "2"}, {"parallel.ep", "2"}, {"parallel.zero", "1"}}, 4,
              true);
}

LOOM_MPI_TEST_MAIN()
