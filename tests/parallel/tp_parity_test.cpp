// Tensor parallelism (and sequence parallelism, and TP x DP with ZeRO-1) against one process,
// as real MPI jobs: initial weights bit-identical to the single-process ones at their global
// positions, gradients after the first step within 1e-5 of the largest, per-step losses over 10
// optimizer steps within 1e-5 relative, for GPT-2 and Llama (GQA) models.
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

constexpr int kSteps = 10, kRows = 2, kT = 16, kMicros = 2;

ModelConfig tp_model(Family f) {
  // 4 query heads, 2 KV heads (GQA for Llama), vocab 62 (even: splits over TP = 2).
  return tiny_model(f, 32, 4, 2, 8, 62);
}

// Global flat index (in the single-process ParamSet) of local element e of parameter p.
int64_t global_index(const ParamInfo& p, const ParamInfo& ref, int64_t e) {
  if (!p.sharded()) return ref.offset + e;
  const int64_t cols = p.numel / p.shape[0], i = e / cols, j = e % cols;
  if (p.shard_dim == 0) return ref.offset + p.global_index[i] * cols + j;
  return ref.offset + i * p.global_shape[1] + p.global_index[0] + j;
}

void check_tp(Family f, int tp, bool sp, int zero, Recompute rc = Recompute::None) {
  comm::Communicator& w = comm::world();
  comm::ParallelDims dims;
  dims.tp = tp;
  comm::ProcessGroups pg(w, dims);
  const int D = pg.dp().size(), dr = pg.dp().rank();
  ModelConfig cfg = tp_model(f);
  StepLog ref = reference_run(cfg, kSteps, kMicros * D, kRows, kT);
  Decoder refm(cfg, cpu_backend());
  refm.params().init(5);

  Decoder m(cfg, cpu_backend(), rc, DType::F32, tensor_parallel_layout(pg, sp));
  m.params().init(5);
  ParamSet& P = m.params();
  // Initial weights: every local element equals the single-process element it stands for.
  for (const ParamInfo& p : P.infos()) {
    const ParamInfo& rp = refm.params().info(p.name);
    for (int64_t e = 0; e < p.numel; ++e)
      ASSERT_EQ(P.data()[p.offset + e], refm.params().data()[global_index(p, rp, e)])
          << p.name << " element " << e;
  }
  DataParallelOptions o;
  o.zero = zero;
  o.bucket_elems = 2000;
  AdamWConfig ac;
  ac.weight_decay = 0.1;
  DataParallel ddp(m, pg.dp(), o, ac, DType::F32, cpu_backend());
  auto weights = grad_norm_weights(P, pg.tp().rank());
  for (int k = 0; k < kSteps; ++k) {
    std::vector<MicroBatch> mb;
    int64_t valid = 0;
    for (int j = 0; j < kMicros; ++j) {
      mb.push_back(make_micro(k, (j * D + dr) * kRows, kRows, kT, cfg.vocab));
      valid += mb.back().valid;
    }
    valid = pg.dp().all_reduce_scalar(valid, comm::ReduceOp::Sum);
    ddp.start_step(kMicros);
    double loss = 0;
    for (int j = 0; j < kMicros; ++j) {
      ddp.start_micro(j);
      loss += m.forward_backward(mb[j].input(), 1.f / valid);
      ddp.finish_micro();
    }
    loss = pg.dp().all_reduce_scalar(loss, comm::ReduceOp::Sum);
    double norm =
        std::sqrt(pg.tp_dp().all_reduce_scalar(ddp.grad_sq_local(weights), comm::ReduceOp::Sum));
    if (k == 0 && zero == 0) {  // reduced gradients against the single-process ones
      ASSERT_NO_FATAL_FAILURE(testing_parallel::expect_grads_match_reference(
          P, refm.params(), ref.first_grads, global_index));
    }
    EXPECT_LT(rel_diff(loss / valid, ref.losses[k]), 1e-5)
        << "step " << k << ": " << loss / valid << " vs " << ref.losses[k];
    EXPECT_LT(rel_diff(norm, ref.norms[k]), 1e-5) << "grad norm, step " << k;
    float gs = norm > kClip ? static_cast<float>(kClip / norm) : 1.f;
    ddp.step(1e-2, gs);
  }
}

int world_size() {
  return comm::world().size();
}

}  // namespace

TEST(TensorParallel, Tp2Gpt2) {
  check_tp(Family::GPT2, 2, false, 0);
}
TEST(TensorParallel, Tp2Llama) {
  check_tp(Family::Llama, 2, false, 0);
}
TEST(TensorParallel, Tp2SequenceParallelGpt2) {
  check_tp(Family::GPT2, 2, true, 0);
}
TEST(TensorParallel, Tp2SequenceParallelLlama) {
  check_tp(Family::Llama, 2, true, 0);
}
TEST(TensorParallel, Tp2SequenceParallelFullRecomputeLlama) {
  check_tp(Family::Llama, 2, true, 0, Recompute::Full);
}
TEST(TensorParallel, Tp2SelectiveRecomputeGpt2) {
  check_tp(Family::GPT2, 2, false, 0, Recompute::Selective);
}
TEST(TensorParallel, Tp2Dp2Zero1) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_tp(Family::Llama, 2, false, 1);
}
TEST(TensorParallel, Tp2Dp2) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_tp(Family::GPT2, 2, false, 0);
}
TEST(TensorParallel, Tp2Dp2SequenceParallelZero1) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_tp(Family::GPT2, 2, true, 1);
}

TEST(TensorParallel, ShapesThatDoNotSplitAreClearErrors) {
  comm::ParallelDims dims;
  dims.tp = 2;
  comm::ProcessGroups pg(comm::world(), dims);
  auto expect_error = [&](ModelConfig c, const char* what) {
    try {
      Decoder m(c, cpu_backend(), Recompute::None, DType::F32, tensor_parallel_layout(pg, false));
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error(tiny_model(Family::GPT2, 33, 3, 3, 11, 62), "model.n_head (3)");
  expect_error(tiny_model(Family::Llama, 32, 4, 1, 8, 62), "model.n_kv_head (1)");
  expect_error(tiny_model(Family::GPT2, 32, 4, 4, 8, 61), "pad the vocabulary");
  // Sequence parallelism needs the tokens to split evenly.
  Decoder m(tp_model(Family::GPT2), cpu_backend(), Recompute::None, DType::F32,
            tensor_parallel_layout(pg, true));
  m.params().init(1);
  MicroBatch odd = make_micro(0, 0, 1, 15, 62);
  EXPECT_THROW(m.forward_backward(odd.input(), 1.f), Error);
}

LOOM_MPI_TEST_MAIN()
