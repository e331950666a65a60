// Mixture of experts under tensor parallelism against one process, as real MPI jobs: the dense
// part split over TP (with and without SP), the experts either replicated over the TP group
// (parallel.etp = 1) or split over it (expert tensor parallelism, etp = tp: w1 by rows of H,
// w2 by columns of F, partial outputs all-reduced), alone and with expert parallelism
// (EP2 x TP2 on 4 ranks), and TP4 with etp = 2. Checked: initial weights bit-identical to the
// single-process ones at their global positions, gradients after the first step within 1e-5 of the
// largest, and 10 steps of losses (aux loss included) and grad norms (each element counted once)
// within 1e-5 relative. Also the layouts that are refused.
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "mpi_main.h"
#include "parallel/data_parallel.h"
#include "parallel/tensor_parallel.h"
#include "parity_util.h"

using namespace loom;
using namespace loom::parallel;
using namespace loom::testing_parallel;

namespace {

ModelConfig moe_tp_model(Family f) {
  return tiny_moe_model(f, 64);  // vocab 64 splits over TP = 2 and 4
}

// Global flat index (in the single-process ParamSet) of local element e of parameter p: TP
// rows/columns, experts (dim 0), and an expert's rows of H (w1) or columns of F (w2).
int64_t global_index(const ParamInfo& p, const ParamInfo& ref, int64_t e) {
  if (!p.sharded()) return ref.offset + e;
  if (p.inner_dim > 0) {
    const int64_t A = p.shape[1], B = p.shape[2], gA = p.global_shape[1], gB = p.global_shape[2];
    const int64_t x = e / (A * B), a = e / B % A, b = e % B;
    const int64_t base = ref.offset + p.global_index[x] * gA * gB;
    return p.inner_dim == 1 ? base + p.inner_index[a] * gB + b
                            : base + a * gB + p.inner_index[0] + b;
  }
  const int64_t cols = p.numel / p.shape[0], i = e / cols, j = e % cols;
  if (p.shard_dim == 0) return ref.offset + p.global_index[i] * cols + j;
  return ref.offset + i * p.global_shape[1] + p.global_index[0] + j;
}

void check_etp(Family f, int tp, int ep, int etp, bool sp, int zero = 0,
               Recompute rc = Recompute::None) {
  comm::ParallelDims dims;
  dims.tp = tp;
  dims.ep = ep;
  comm::ProcessGroups pg(comm::world(), dims);
  ModelConfig cfg = moe_tp_model(f);
  Reference ref(cfg, pg.dp().size());
  Decoder m(cfg, cpu_backend(), rc, DType::F32, tensor_parallel_layout(pg, sp),
            expert_parallel_layout(pg, etp));
  m.params().init(5);
  int experts_seen = 0;
  for (const ParamInfo& p : m.params().infos()) {
    if (!p.expert) continue;
    ++experts_seen;
    ASSERT_EQ(p.numel * ep * etp, ref.model.params().info(p.name).numel) << p.name;
  }
  ASSERT_EQ(experts_seen, 2 * cfg.n_layer);
  expect_trains_like_reference(
      ref, m,
      {.dp = pg.dp(),
       .zero = zero,
       .expert_dp = &pg.edp(),
       .sums = {pg.dp(), pg.tp_dp(), grad_norm_weights(m.params(), pg.tp().rank(), etp)}},
      global_index);
}

}  // namespace

// 2 ranks: TP = 2 with the experts replicated (etp = 1) or split (etp = 2).
TEST(ExpertTensorParallel, Tp2Etp1Gpt2) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_etp(Family::GPT2, 2, 1, 1, false);
}
TEST(ExpertTensorParallel, Tp2Etp1SequenceParallelLlama) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_etp(Family::Llama, 2, 1, 1, true);
}
TEST(ExpertTensorParallel, Tp2Etp2Llama) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_etp(Family::Llama, 2, 1, 2, false);
}
TEST(ExpertTensorParallel, Tp2Etp2SequenceParallelGpt2) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_etp(Family::GPT2, 2, 1, 2, true);
}
TEST(ExpertTensorParallel, Tp2Etp2SequenceParallelFullRecomputeLlama) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_etp(Family::Llama, 2, 1, 2, true, 0, Recompute::Full);
}
// 4 ranks: EP2 x TP2 (expert parallelism over the DP dimension, expert TP inside TP).
TEST(ExpertTensorParallel, Ep2Tp2Etp2Llama) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_etp(Family::Llama, 2, 2, 2, false);
}
TEST(ExpertTensorParallel, Ep2Tp2Etp1Gpt2Zero1) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_etp(Family::GPT2, 2, 2, 1, true, 1);
}

// 4 ranks: TP = 4 with the experts split over pairs of TP ranks (1 < etp < tp: two ETP
// groups, each holding the experts whole once).
TEST(ExpertTensorParallel, Tp4Etp2Gpt2) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_etp(Family::GPT2, 4, 1, 2, false);
}

TEST(ExpertTensorParallel, BadLayoutsAreClearErrors) {
  comm::ParallelDims dims;
  dims.tp = world_size();
  comm::ProcessGroups pg(comm::world(), dims);
  auto expect_error = [](auto&& make, const char* what) {
    try {
      make();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // etp must divide tp.
  expect_error([&] { expert_parallel_layout(pg, 3); }, "parallel.etp (3) must divide");
  // The experts' FFN width must split over etp (checked on its own: no TP here).
  ModelConfig c = moe_tp_model(Family::GPT2);
  c.d_ff = 49;
  ExpertParallel ep = expert_parallel_layout(pg, 2);
  expect_error([&] { Decoder m(c, cpu_backend(), Recompute::None, DType::F32, {}, ep); },
               "model.d_ff (49)");
  // A layout's etp larger than the decoder's TP group.
  expect_error(
      [&] {
        Decoder m(moe_tp_model(Family::GPT2), cpu_backend(), Recompute::None, DType::F32, {}, ep);
      },
      "parallel.etp (2) must divide parallel.tp (1)");
  // Expert tensor parallelism on a dense model.
  expect_error(
      [&] {
        Decoder m(tiny_model(Family::GPT2, 32, 4, 4, 8, 64), cpu_backend(), Recompute::None,
                  DType::F32, tensor_parallel_layout(pg, false), ep);
      },
      "needs a mixture-of-experts model");
}

LOOM_MPI_TEST_MAIN()
