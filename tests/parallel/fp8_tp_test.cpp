// FP8 recipes under tensor parallelism: every per-tensor scale (x, W, dy of every block linear)
// equals the single-process one (up to the summation-order differences of x and dy), because each
// amax is max-reduced over the TP group (current scaling per call, delayed scaling once per step);
// losses then match one process up to summation order. Without the reduction, split tensors
// (row-parallel W and x, column-parallel W and dy) would get their shard's scale and these checks
// fail.
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "mpi_main.h"
#include "parallel/tensor_parallel.h"
#include "parity_util.h"
#include "precision/fp8_recipes.h"

using namespace loom;
using namespace loom::parallel;
using namespace loom::testing_parallel;

namespace {

void check_fp8_tp(Family f, Fp8RecipeKind kind, bool sp) {
  comm::ParallelDims dims;
  dims.tp = world_size();
  comm::ProcessGroups pg(comm::world(), dims);
  const ModelConfig cfg = tiny_model(f, 32, 4, 2, 8, 62);
  Decoder one(cfg, cpu_backend(), Recompute::None, DType::F32);
  Decoder tp(cfg, cpu_backend(), Recompute::None, DType::F32, tensor_parallel_layout(pg, sp));
  one.params().init(5);
  tp.params().init(5);
  Fp8Options o;
  o.kind = kind;
  o.hybrid = true;
  o.amax_history = 4;
  Fp8Recipes r1(one, o), r2(tp, o);
  ASSERT_EQ(r1.names(), r2.names());
  for (int step = 0; step < 3; ++step) {
    const MicroBatch mb = make_micro(step, 0, 2, 16, cfg.vocab);
    const float dloss = 1.f / float(mb.valid);
    r1.begin_step();
    r2.begin_step();
    one.params().zero_grad();
    tp.params().zero_grad();
    const double l1 = one.forward_backward(mb.input(), dloss);
    const double l2 = tp.forward_backward(mb.input(), dloss);
    EXPECT_LT(rel_diff(l1, l2), 1e-5) << "step " << step;
    // Weights are bit-identical, so their scales are equal; x and dy carry the summation-order
    // differences of the split GEMMs (~1e-7 relative), and so do their scales. A shard's own
    // amax instead of the global one is off by far more on at least one of the ranks.
    for (const std::string& n : r1.names()) {
      const Fp8Linear *a = r1.get(n), *b = r2.get(n);
      ASSERT_EQ(a->scale(Fp8Linear::W), b->scale(Fp8Linear::W)) << n << " step " << step;
      for (auto t : {Fp8Linear::X, Fp8Linear::DY})
        ASSERT_LT(rel_diff(a->scale(t), b->scale(t)), 1e-5)
            << n << " tensor " << t << " step " << step << " rank " << pg.tp().rank();
    }
  }
}

}  // namespace

TEST(Fp8TensorParallel, CurrentScalingGpt2) {
  check_fp8_tp(Family::GPT2, Fp8RecipeKind::TensorwiseCurrent, false);
}
TEST(Fp8TensorParallel, CurrentScalingSequenceParallelLlama) {
  check_fp8_tp(Family::Llama, Fp8RecipeKind::TensorwiseCurrent, true);
}
TEST(Fp8TensorParallel, DelayedScalingLlama) {
  check_fp8_tp(Family::Llama, Fp8RecipeKind::TensorwiseDelayed, false);
}

LOOM_MPI_TEST_MAIN()
