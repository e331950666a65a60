// Tensor parallelism (and sequence parallelism, and TP x DP with ZeRO-1) against one process,
// as real MPI jobs: initial weights bit-identical to the single-process ones at their global
// positions, gradients after the first step within 1e-5 of the largest, per-step losses over 10
// optimizer steps within 1e-5 relative, for GPT-2 and Llama (GQA) models.
#include <gtest/gtest.h>

#include <cstring>

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
  comm::ParallelDims dims;
  dims.tp = tp;
  comm::ProcessGroups pg(comm::world(), dims);
  ModelConfig cfg = tp_model(f);
  Reference ref(cfg, pg.dp().size());
  Decoder m(cfg, cpu_backend(), rc, DType::F32, tensor_parallel_layout(pg, sp));
  m.params().init(5);
  expect_trains_like_reference(
      ref, m,
      {.dp = pg.dp(),
       .zero = zero,
       .sums = {pg.dp(), pg.tp_dp(), grad_norm_weights(m.params(), pg.tp().rank())}},
      global_index);
}

// The bf16 policy's typed activation storage (bf16 buffers gathered along the sequence under
// SP) against fp32 containers of the same rounded values, on the same tensor-parallel layout:
// loss and gradients bit for bit.
void check_bf16_storage(Family f, bool sp) {
  comm::ParallelDims dims;
  dims.tp = 2;
  comm::ProcessGroups pg(comm::world(), dims);
  const ModelConfig cfg = tp_model(f);
  MicroBatch mb = make_micro(0, 0, 2, 16, cfg.vocab);
  std::vector<float> grads[2];
  double loss[2];
  for (int k = 0; k < 2; ++k) {
    Decoder m(cfg, cpu_backend(), Recompute::None, DType::BF16, tensor_parallel_layout(pg, sp));
    if (k == 1) m.store_activations_as_fp32();
    m.params().init(5);
    round_to(DType::BF16, m.params().data(), size_t(m.params().total()));
    m.params().zero_grad();
    loss[k] = m.forward_backward(mb.input(), 1.f / 32);
    grads[k].assign(m.params().grad(), m.params().grad() + m.params().total());
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * sizeof(float)));
}

// The forward-only paths under TP (with and without SP) against one process on the same
// packed micro-batch: forward_logits of chosen rows (from both ranks' halves of the sequence
// under SP, one row twice) and the sequences' and tokens' log-probabilities of forward_loss,
// within 1e-5 of the largest value (the TP tests' tolerance: the row-parallel sums reorder).
void check_forward_only(Family f, bool sp) {
  comm::ParallelDims dims;
  dims.tp = 2;
  comm::ProcessGroups pg(comm::world(), dims);
  const ModelConfig cfg = tp_model(f);
  Decoder one(cfg, cpu_backend());
  one.params().init(5);
  Decoder m(cfg, cpu_backend(), Recompute::None, DType::F32, tensor_parallel_layout(pg, sp));
  m.params().init(5);
  const MicroBatch mb = make_micro(3, 0, 2, 16, cfg.vocab, {5, 14, 13});
  const std::vector<int> rows = {31, 0, 17, 15, 16, 4, 31};
  std::vector<float> want(rows.size() * cfg.vocab), got(want.size(), -1e30f);
  one.forward_logits(mb.input(), rows, want.data());
  m.forward_logits(mb.input(), rows, got.data());
  float peak = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    peak = std::max(peak, std::abs(want[i]));
    worst = std::max(worst, std::abs(want[i] - got[i]));
  }
  EXPECT_GT(peak, 0.f);
  EXPECT_LE(worst, 1e-5f * peak) << "forward_logits under tp=2 sp=" << sp;
  StepOutputs a, b;
  a.want_token_logprobs = b.want_token_logprobs = true;
  const double la = one.forward_loss(mb.input(), &a), lb = m.forward_loss(mb.input(), &b);
  EXPECT_NEAR(la, lb, 1e-5 * std::abs(la));
  ASSERT_EQ(a.seq_logprobs.size(), b.seq_logprobs.size());
  ASSERT_EQ(a.seq_logprobs.size(), mb.cu.size() - 1);
  for (size_t s = 0; s < a.seq_logprobs.size(); ++s)
    EXPECT_NEAR(a.seq_logprobs[s], b.seq_logprobs[s], 1e-5 * std::abs(a.seq_logprobs[s]) + 1e-9)
        << "sequence " << s;
  ASSERT_EQ(a.token_logprobs.size(), b.token_logprobs.size());
  for (size_t i = 0; i < a.token_logprobs.size(); ++i)
    EXPECT_NEAR(a.token_logprobs[i], b.token_logprobs[i],
                1e-5 * (1 + std::abs(a.token_logprobs[i])))
        << "token " << i;
  // Under SP the tokens must split over the group, as for a step: a clear error on every rank
  // before any collective.
  if (sp) {
    const MicroBatch odd = make_micro(0, 0, 1, 15, cfg.vocab);
    try {
      m.forward_logits(odd.input(), {0}, got.data());
      ADD_FAILURE() << "15 tokens over 2 SP ranks were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("splits the 15 tokens"), std::string::npos) << e.what();
    }
  }
}

}  // namespace

TEST(TensorParallel, ForwardLogitsUnderTpGpt2) {
  check_forward_only(Family::GPT2, false);
}
TEST(TensorParallel, ForwardLogitsUnderSequenceParallelGpt2) {
  check_forward_only(Family::GPT2, true);
}
TEST(TensorParallel, ForwardLogitsUnderSequenceParallelLlama) {
  check_forward_only(Family::Llama, true);
}

TEST(TensorParallel, Bf16StorageUnderTp) {
  check_bf16_storage(Family::GPT2, false);
}
TEST(TensorParallel, Bf16StorageUnderSequenceParallelLlama) {
  check_bf16_storage(Family::Llama, true);
}

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
