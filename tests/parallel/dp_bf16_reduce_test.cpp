// Reduced-precision gradient reduction (parallel.grad_reduce_dtype = "bf16") as real MPI jobs
// (mpirun -n 2 and -n 4), ZeRO 0-3:
//  - the reduced gradients of the first step are, bit for bit, the rank-order fp32 sums of every
//    rank's bf16-rounded gradients, computed here from each rank's own backward on a plain
//    Decoder (ZeRO-0: those sums rounded to bf16; ZeRO-2/3: one sum per micro-batch, added);
//  - 10 training steps follow the fp32-reduction run's losses and grad norms within 1e-2
//    relative (bf16 keeps 8 significant bits), every rank ending with the same parameters;
//  - the gradient bytes on the wire per step are half the fp32 run's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/error.h"
#include "mpi_main.h"
#include "parallel/data_parallel.h"
#include "parity_util.h"

using namespace loom;
using namespace loom::parallel;
using namespace loom::testing_parallel;

namespace {

ModelConfig bf16_model(Family f) {
  // Odd widths: the flat buffer does not divide by the DP size.
  return f == Family::GPT2 ? tiny_model(f, 33, 3, 3, 11) : tiny_model(f, 33, 3, 1, 8);
}

struct Run {
  std::vector<double> losses, norms;
  std::vector<float> first_grads;  // reduced gradients of step 0 on [lo, hi) (ZeRO-0: all)
  int64_t lo = 0, hi = 0;
  int64_t wire_bytes_per_step = 0;
  std::vector<float> final_params;
};

Run train(const ModelConfig& cfg, int zero, DType reduce, bool overlap = true) {
  comm::Communicator& dp = comm::world();
  const int D = dp.size(), r = dp.rank();
  Decoder m(cfg, cpu_backend());
  m.params().init(5);
  DataParallelOptions o;
  o.zero = zero;
  o.overlap = overlap;
  o.bucket_elems = 3000;
  o.grad_reduce_dtype = reduce;
  DataParallel ddp(m, dp, o, parity_adamw(), DType::F32, cpu_backend());
  Run out;
  out.lo = zero == 0 ? 0 : ddp.shard_begin();
  out.hi = zero == 0 ? m.params().total() : ddp.shard_end();
  for (int k = 0; k < kSteps; ++k) {
    std::vector<MicroBatch> mb = rank_micros(k, kMicros, D, r, cfg.vocab);
    const int64_t valid = global_valid(mb, dp);
    double loss = accumulate_micros(m, ddp, inputs(mb), 1.f / valid);
    if (k == 0) {
      out.wire_bytes_per_step = ddp.grad_wire_bytes();
      if (zero == 0)
        out.first_grads.assign(m.params().grad(), m.params().grad() + m.params().total());
      else
        out.first_grads = ddp.reduced_grad_shard();
    }
    loss = dp.all_reduce_scalar(loss, comm::ReduceOp::Sum);
    double norm = std::sqrt(dp.all_reduce_scalar(ddp.grad_sq_local(), comm::ReduceOp::Sum));
    ddp.step(1e-2, norm > kClip ? static_cast<float>(kClip / norm) : 1.f);
    out.losses.push_back(loss / valid);
    out.norms.push_back(norm);
  }
  EXPECT_EQ(ddp.grad_wire_bytes(), out.wire_bytes_per_step * kSteps);
  ddp.sync_model_from_master();
  out.final_params.assign(m.params().data(), m.params().data() + m.params().total());
  return out;
}

// Every rank's local gradients of step 0 (one buffer per micro-batch when `per_micro`, else
// accumulated over the step's micro-batches), from a plain Decoder, gathered: [rank][element]
// flattened, micro-batch by micro-batch.
std::vector<std::vector<float>> all_local_grads(const ModelConfig& cfg, bool per_micro) {
  comm::Communicator& w = comm::world();
  const int D = w.size(), r = w.rank();
  Decoder m(cfg, cpu_backend());
  m.params().init(5);
  const int64_t n = m.params().total();
  std::vector<MicroBatch> mb = rank_micros(0, kMicros, D, r, cfg.vocab);
  const float dloss = 1.f / static_cast<float>(global_valid(mb, w));
  std::vector<std::vector<float>> out;
  m.params().zero_grad();
  for (int j = 0; j < kMicros; ++j) {
    if (per_micro) m.params().zero_grad();
    m.forward_backward(mb[j].input(), dloss);
    if (!per_micro && j + 1 < kMicros) continue;
    std::vector<float> all(n * D);
    std::memcpy(all.data() + r * n, m.params().grad(), n * 4);
    w.all_gather(all.data(), std::vector<int64_t>(D, n), DType::F32);
    out.push_back(std::move(all));
  }
  return out;
}

// What the bf16 reduction must give for step 0: per gathered buffer, the rank-order fp32 sum of
// the bf16-rounded gradients; the buffers (micro-batches) added in order; ZeRO-0 rounds the sum.
std::vector<float> expected_reduced(const ModelConfig& cfg, int zero) {
  const int D = comm::world().size();
  std::vector<std::vector<float>> local = all_local_grads(cfg, zero >= 2);
  const int64_t n = static_cast<int64_t>(local[0].size()) / D;
  std::vector<float> want(n, 0.f);
  for (const auto& all : local)
    for (int64_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int q = 0; q < D; ++q) sum += round_bf16(all[q * n + i]);
      want[i] += sum;
    }
  if (zero == 0)
    for (float& g : want) g = round_bf16(g);
  return want;
}

void check_bf16_reduction(Family f, int zero, bool overlap = true) {
  const ModelConfig cfg = bf16_model(f);
  Run fp32 = train(cfg, zero, DType::F32, overlap);
  Run bf16 = train(cfg, zero, DType::BF16, overlap);

  // (a) the reduced gradients, exactly.
  const std::vector<float> want = expected_reduced(cfg, zero);
  int64_t differs_from_fp32 = 0;
  for (int64_t i = bf16.lo; i < bf16.hi; ++i) {
    ASSERT_EQ(bf16.first_grads[i - bf16.lo], want[i]) << "reduced gradient element " << i;
    differs_from_fp32 += bf16.first_grads[i - bf16.lo] != fp32.first_grads[i - fp32.lo];
  }
  if (bf16.hi > bf16.lo) {
    EXPECT_GT(differs_from_fp32, 0) << "bf16 reduction should change some gradient bits";
  }

  // (b) training follows the fp32 reduction: losses within 1e-2 relative; grad norms within
  // 1e-2 at the first step (the same weights) and 5e-2 after, where Adam has turned the
  // rounding of near-zero gradients into +-lr differences of the weights.
  double worst_loss = 0, worst_norm = 0;
  for (int k = 0; k < kSteps; ++k) {
    const double dl = rel_diff(bf16.losses[k], fp32.losses[k]);
    const double dn = rel_diff(bf16.norms[k], fp32.norms[k]);
    worst_loss = std::max(worst_loss, dl);
    worst_norm = std::max(worst_norm, dn);
    EXPECT_LT(dl, 1e-2) << "step " << k << ": " << bf16.losses[k] << " vs " << fp32.losses[k];
    EXPECT_LT(dn, k == 0 ? 1e-2 : 5e-2) << "grad norm, step " << k;
  }
  if (comm::world().rank() == 0)
    std::printf(
        "zero %d: bf16 vs fp32 reduction over %d steps: loss within %.2e, grad norm within "
        "%.2e relative; %lld vs %lld gradient bytes on the wire per step\n",
        zero, kSteps, worst_loss, worst_norm, static_cast<long long>(bf16.wire_bytes_per_step),
        static_cast<long long>(fp32.wire_bytes_per_step));
  EXPECT_LT(bf16.losses.back(), bf16.losses.front()) << "the bf16-reduced run should learn";
  double sum = 0;
  for (size_t i = 0; i < bf16.final_params.size(); ++i)
    sum += double(bf16.final_params[i]) * double(1 + i % 7);
  comm::Communicator& w = comm::world();
  EXPECT_EQ(w.all_reduce_scalar(sum, comm::ReduceOp::Max),
            -w.all_reduce_scalar(-sum, comm::ReduceOp::Max))
      << "every rank should end with the same parameters";

  // (c) half the bytes.
  EXPECT_GT(fp32.wire_bytes_per_step, 0);
  EXPECT_EQ(2 * bf16.wire_bytes_per_step, fp32.wire_bytes_per_step);
}

}  // namespace

TEST(Bf16GradReduce, Zero0AllReduce) {
  check_bf16_reduction(Family::GPT2, 0);
}
TEST(Bf16GradReduce, Zero0WithoutOverlap) {
  check_bf16_reduction(Family::Llama, 0, false);
}
TEST(Bf16GradReduce, Zero1ReduceScatter) {
  check_bf16_reduction(Family::GPT2, 1);
}
TEST(Bf16GradReduce, Zero2ReduceScatterEveryMicroBatch) {
  check_bf16_reduction(Family::Llama, 2);
}
TEST(Bf16GradReduce, Zero3ReduceScatterEveryMicroBatch) {
  check_bf16_reduction(Family::GPT2, 3);
}

TEST(Bf16GradReduce, ConfigKeyParsedAndCheckedByName) {
  EXPECT_EQ(DataParallelOptions::from(Config::parse("", "test")).grad_reduce_dtype, DType::F32);
  Config bf16 = Config::parse("[parallel]\ngrad_reduce_dtype = \"bf16\"\n", "test");
  EXPECT_EQ(DataParallelOptions::from(bf16).grad_reduce_dtype, DType::BF16);
  Config fp16 = Config::parse("[parallel]\ngrad_reduce_dtype = \"fp16\"\n", "test");
  try {
    DataParallelOptions::from(fp16);
    ADD_FAILURE() << "fp16 should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.grad_reduce_dtype"), std::string::npos)
        << e.what();
  }
}

LOOM_MPI_TEST_MAIN()
