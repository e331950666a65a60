// The GPU recipe's delayed-scaling state (precision/device_fp8_scaling.h) over data-parallel
// ranks: each rank records the amaxes of its own micro-batches, begin_step max-reduces them in
// one all-reduce of the state's buffer (here the CPU backend's memory through the MPI world; on
// a GPU the trainer's NCCL communicator, the same call) and every rank must hold what the CPU
// recipe does with its host reduction (Fp8Recipes::begin_step), bit for bit: scales, histories
// and checkpoint state. The ranks' tensors differ, so a state that skipped the reduction, or
// rolled a tensor this rank never recorded (rank 1 leaves out layer 0's backward at step 1; rank
// 0's layer 1 has a non-finite x at step 3), would differ from the reference.
#include <gtest/gtest.h>

#include <limits>

#include "comm/communicator.h"
#include "mpi_main.h"
#include "precision/fp8_scaling_check.h"

using namespace loom;

namespace {

TEST(Fp8DeviceAmax, DataParallelReductionEqualsTheCpuRecipe) {
  comm::Communicator& w = comm::world();
  ASSERT_GT(w.size(), 1) << "run on several ranks";
  Fp8Options o;
  o.kind = Fp8RecipeKind::TensorwiseDelayed;
  o.hybrid = true;
  o.amax_history = 4;
  test::Fp8ScalingPair p(cpu_backend(), o, 2);
  for (int s = 0; s < 6; ++s) {
    for (int i = 0; i < 2; ++i) {
      test::Fp8StepTensors d = test::fp8_step_tensors(s, i, w.rank());
      if (s == 3 && i == 1 && w.rank() == 0) d.x[3] = std::numeric_limits<float>::quiet_NaN();
      p.feed(size_t(i), d, !(s == 1 && i == 0 && w.rank() == 1));
    }
    p.begin_step(&w, &w);
    const std::string bad = p.compare(cat("rank ", w.rank(), " step ", s));
    EXPECT_TRUE(bad.empty()) << bad;
  }
  // Every rank recorded every tensor at the last step: their scales agree (one process's).
  for (int t = 0; t < 3; ++t) {
    const double s = p.device().scale(1, t);
    EXPECT_EQ(w.all_reduce_scalar(s, comm::ReduceOp::Max), s) << "tensor " << t;
  }
}

}  // namespace

LOOM_MPI_TEST_MAIN()
