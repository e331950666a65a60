// Pipeline parallelism against one process, as real MPI jobs: the decoder's layers split into
// stages (assign_layers), each rank running its stage's actions from a schedule (GPipe, 1F1B,
// interleaved 1F1B) with asynchronous sends and receives; tied embeddings on the first and
// last stage kept in sync; the loss on the last stage. Checked: initial weights bit-identical
// to the single-process ones, 10 steps of losses and grad norms within 1e-5 relative (grad
// norm counts the tied embedding once), and every schedule completing for several micro-batch
// counts (a deadlock shows up as the CTest TIMEOUT). ZeRO-3 under the pipeline (PP2 x DP2): the
// same parity, at most two blocks gathered at once, the engine's own draw of its shard
// bit-identical to one process, and only the stage's shard and its embeddings / head resident after
// a step; also for MoE stages, with the experts gathered with their block (ep = 1) or sharded over
// the expert-data-parallel group.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "mpi_main.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parity_util.h"

using namespace loom;
using namespace loom::parallel;
using namespace loom::testing_parallel;

namespace {

ModelConfig pp_model(Family f, int layers, bool moe = false) {
  ModelConfig c = moe ? tiny_moe_model(f) : tiny_model(f, 32, 4, 2, 8);
  c.n_layer = layers;
  return c;
}

// The flat index, in one process's ParamSet (where the parameter is `ref`), of element e of this
// rank's parameter `local` (expert-parallel experts hold some of the experts).
int64_t ref_index(const ParamInfo& local, const ParamInfo& ref, int64_t e) {
  if (!local.sharded()) return ref.offset + e;
  const int64_t cols = local.numel / local.shape[0];
  return ref.offset + local.global_index[e / cols] * cols + e % cols;
}

// Every element of `q` equals the one-process element it stands for, bit for bit.
void expect_param_matches(const ParamSet& P, const ParamInfo& q, const ParamSet& R) {
  const ParamInfo& rq = R.info(q.name);
  for (int64_t e = 0; e < q.numel; ++e)
    ASSERT_EQ(P.data()[q.offset + e], R.data()[ref_index(q, rq, e)]) << q.name << " element " << e;
}

// The elements of the parameters outside the blocks (embeddings, final norm, head): what
// ZeRO-3 keeps gathered.
int64_t resident_elems(const ParamSet& P) {
  int64_t n = 0;
  for (const ParamInfo& q : P.infos())
    if (q.name.rfind("blocks.", 0) != 0) n += q.numel;
  return n;
}

// ZeRO-3 that drew its own weights (DataParallelOptions::init_seed) on an uninitialised stage:
// every parameter, block ones gathered through the hooks the runner calls, equals one
// process's init() bit for bit.
void expect_drawn_weights_match(Decoder& model, const Decoder& refm) {
  const ParamSet& P = model.params();
  auto expect_same = [&](const ParamInfo& q) { expect_param_matches(P, q, refm.params()); };
  for (const ParamInfo& q : P.infos())
    if (q.name.rfind("blocks.", 0) != 0) expect_same(q);
  for (auto [b, e] : model.pipeline_stage().chunks)
    for (int l = b; l < e; ++l) {
      model.before_block(l, false);
      for (const ParamInfo& q : P.infos())
        if (q.name.rfind("blocks." + std::to_string(l) + ".", 0) == 0) expect_same(q);
      model.after_block(l, false);
    }
}

// After a step, ZeRO-3 under the pipeline holds of the parameters only what stays gathered
// (the stage's embeddings, final norm, head; nothing on a middle stage) plus its shard of the
// stage in the fp32 master: no page of the blocks, within a page at each range's edges.
// `shard`: the stage's share over DP in bytes (under EP, plus its experts' share over edp).
void expect_zero3_stage_memory(const DataParallel& ddp, const ParamSet& P, int64_t shard) {
  const int64_t page = sysconf(_SC_PAGESIZE), resident = resident_elems(P) * 4;
  // The runs of block parameters (one per block beyond the first two, one per expert
  // parameter), each with a partial page at its edges.
  int64_t pieces = 0;
  std::set<std::string> blocks;
  for (const ParamInfo& q : P.infos()) {
    pieces += q.expert ? 1 : 0;
    if (q.name.rfind("blocks.", 0) == 0) blocks.insert(q.name.substr(0, q.name.find('.', 7)));
  }
  pieces += std::max<int64_t>(0, int64_t(blocks.size()) - 2);
  const MemoryUse u = ddp.memory_use();
  EXPECT_GE(u.params, resident);
  EXPECT_LE(u.params, resident + (4 + 2 * pieces) * page) << "block parameters left gathered";
  EXPECT_LE(u.optim, 3 * shard + 6 * page) << "m, v and master of more than the shard";
  EXPECT_LT(u.params + u.optim / 3, resident + shard + (6 + 2 * pieces) * page);
}

// moe: a MoE model (4 experts, top-2) with its experts split over `ep` ranks of each stage's DP
// group. Under ZeRO-3 at most two blocks (the one in use and the prefetched next one) are ever
// gathered at once, in training and in evaluation.
void check_pp(Family f, pp::ScheduleKind kind, int p, int v, int m, int zero, int steps = kSteps,
              int layers_per_stage = 2, bool engine_draws = false, bool moe = false, int ep = 1,
              Recompute recompute = Recompute::None) {
  comm::ParallelDims dims;
  dims.pp = p;
  dims.ep = ep;
  comm::ProcessGroups pg(comm::world(), dims);
  const int D = pg.dp().size(), dr = pg.dp().rank();
  ModelConfig cfg = pp_model(f, layers_per_stage * p * v, moe);
  StepLog ref = reference_run(cfg, steps, m * D, kRows, kT);
  Decoder refm(cfg, cpu_backend());
  refm.params().init(5);

  pp::StageLayout layout = pp::assign_layers(cfg.n_layer, p, v);
  Decoder model(cfg, cpu_backend(), recompute, DType::F32, {},
                moe ? expert_parallel_layout(pg) : ExpertParallel{},
                pipeline_stage_of(layout, pg.pp().rank()));
  ParamSet& P = model.params();
  if (!engine_draws) {
    P.init(5);
    for (const ParamInfo& q : P.infos())
      ASSERT_NO_FATAL_FAILURE(expect_param_matches(P, q, refm.params()));
  }
  DataParallelOptions o;
  o.zero = zero;
  o.bucket_elems = 2000;
  if (engine_draws) o.init_seed = 5;
  DataParallel ddp(model, pg.dp(), o, parity_adamw(), DType::F32, cpu_backend(),
                   ep > 1 ? &pg.edp() : nullptr);
  if (engine_draws) {
    ASSERT_NO_FATAL_FAILURE(expect_drawn_weights_match(model, refm));
  }
  PipelineRunner runner(model, pg.pp(), pp::make_schedule(kind, p, m, v));
  auto run_step = [&](int k) {
    std::vector<MicroBatch> mb = rank_micros(k, m, D, dr, cfg.vocab);
    const int64_t valid = global_valid(mb, pg.dp());
    return RankStep{pipeline_step(runner, ddp, inputs(mb), 1.f / valid, pg.pp()), valid};
  };
  expect_steps_match_reference(ref, ddp, {pg.dp(), pg.world(), runner.grad_norm_weights()},
                               run_step, std::string(pp::schedule_kind_name(kind)) + " ");
  if (zero == 3) {
    int64_t experts = 0;
    for (const ParamInfo& q : P.infos()) experts += q.expert && ep > 1 ? q.numel : 0;
    const int E = pg.edp().size();
    const int64_t shard = (P.total() - experts + D - 1) / D * 4 + (experts + E - 1) / E * 4;
    ASSERT_NO_FATAL_FAILURE(expect_zero3_stage_memory(ddp, P, shard));
    EXPECT_LE(ddp.max_gathered_units(), 2) << "blocks gathered at once in training";
    ddp.reset_max_gathered_units();
    std::vector<MicroBatch> eval = rank_micros(steps, m + 1, D, dr, cfg.vocab);
    runner.forward_only(inputs(eval));
    EXPECT_LE(ddp.max_gathered_units(), 2) << "blocks gathered at once in evaluation";
    ASSERT_NO_FATAL_FAILURE(expect_zero3_stage_memory(ddp, P, shard));
  }
  // Tied embeddings: the first and last stage's copies are still identical.
  if (cfg.tied && p > 1 && (pg.pp().rank() == 0 || pg.pp().rank() == p - 1)) {
    const ParamInfo& e = P.info("embed.wte");
    std::vector<float> mine(P.data() + e.offset, P.data() + e.offset + e.numel);
    std::vector<float> other(mine.size());
    const int r = pg.pp().rank();
    if (r == 0) pg.pp().recv(other.data(), e.numel, DType::F32, p - 1, 77);
    if (r == p - 1) pg.pp().send(mine.data(), e.numel, DType::F32, 0, 77);
    if (r == 0) {
      EXPECT_EQ(0, std::memcmp(mine.data(), other.data(), mine.size() * 4));
    }
  }
}

}  // namespace

TEST(PipelineParallel, Pp2GpipeGpt2Tied) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::GPipe, 2, 1, 4, 0);
}
TEST(PipelineParallel, Pp2OneFOneBLlama) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_pp(Family::Llama, pp::ScheduleKind::OneFOneB, 2, 1, 4, 0);
}
TEST(PipelineParallel, Pp2InterleavedV2Gpt2) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::Interleaved, 2, 2, 4, 0);
}
TEST(PipelineParallel, Pp4GpipeLlama) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::Llama, pp::ScheduleKind::GPipe, 4, 1, 4, 0);
}
TEST(PipelineParallel, Pp4OneFOneBGpt2) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::OneFOneB, 4, 1, 6, 0);
}
TEST(PipelineParallel, Pp2Dp2OneFOneBZero1) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::OneFOneB, 2, 1, 3, 1);
}

// ZeRO-3 under the pipeline: each DP rank of a stage keeps its shard of the stage's blocks,
// gathered block by block around every forward and backward of it, the gradients reduce-scattered
// once after the pipeline; tied embeddings summed between the first and last stage first.
TEST(PipelineParallel, Pp2Zero3OneFOneBLlama) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_pp(Family::Llama, pp::ScheduleKind::OneFOneB, 2, 1, 4, 3);
}
TEST(PipelineParallel, Pp2Dp2Zero3GpipeGpt2Tied) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::GPipe, 2, 1, 4, 3);
}
TEST(PipelineParallel, Pp2Dp2Zero3OneFOneBGpt2Tied) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::OneFOneB, 2, 1, 3, 3);
}
TEST(PipelineParallel, Pp2Dp2Zero3GpipeLlama) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::Llama, pp::ScheduleKind::GPipe, 2, 1, 3, 3);
}
TEST(PipelineParallel, Pp2Dp2Zero3OneFOneBLlama) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::Llama, pp::ScheduleKind::OneFOneB, 2, 1, 4, 3);
}
TEST(PipelineParallel, Pp2Dp2Zero3InterleavedV2Gpt2Tied) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::Interleaved, 2, 2, 4, 3);
}
// MoE stages under ZeRO-3: a block's experts (after every other parameter of the stage) are
// gathered and released with it, sharded over DP (ep = 1) or over the expert-data-parallel group.
TEST(PipelineParallel, Pp2Zero3MoeGpipeGpt2) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::GPipe, 2, 1, 4, 3, kSteps, 2, true, true);
}
TEST(PipelineParallel, Pp2Dp2Zero3MoeOneFOneBLlama) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::Llama, pp::ScheduleKind::OneFOneB, 2, 1, 4, 3, kSteps, 2, true, true);
}
TEST(PipelineParallel, Pp2Ep2Zero3MoeInterleavedV2Gpt2Tied) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::Interleaved, 2, 2, 4, 3, kSteps, 1, false, true, 2);
}
// The engine draws only its shard and the gathered parameters: bit-identical to one process.
TEST(PipelineParallel, Zero3DrawsTheStageShardLikeOneProcess) {
  const int p = 2;
  check_pp(Family::GPT2, pp::ScheduleKind::OneFOneB, p, 1, 4, 3, kSteps, 2, true);
  check_pp(Family::Llama, pp::ScheduleKind::GPipe, p, 1, 2, 3, 2, 1, true);
  if (world_size() == 4)  // a middle stage holds no resident parameter at all
    check_pp(Family::GPT2, pp::ScheduleKind::OneFOneB, 4, 1, 4, 3, 2, 1, true);
}

// Four blocks per stage: ZeRO-3 gathers them one at a time within the stage (plus the prefetched
// next one), also with the backward recomputing each block, with parity to one process.
TEST(PipelineParallel, Zero3GathersOneBlockAtATime) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  check_pp(Family::GPT2, pp::ScheduleKind::OneFOneB, 2, 1, 4, 3, 3, 4, true);
  check_pp(Family::Llama, pp::ScheduleKind::GPipe, 2, 1, 3, 3, 3, 4, false, false, 1,
           Recompute::Full);
  check_pp(Family::GPT2, pp::ScheduleKind::Interleaved, 2, 2, 4, 3, 3, 3, false, false, 1,
           Recompute::Selective);
  check_pp(Family::Llama, pp::ScheduleKind::OneFOneB, 2, 1, 4, 3, 3, 4, true, true);
}

// Every schedule on this world, for several micro-batch counts, runs to completion with the
// single-process loss (one step, one layer per stage). A schedule that deadlocks hangs here
// and the test fails by its CTest TIMEOUT.
TEST(PipelineParallel, EveryScheduleCompletes) {
  const int p = world_size();
  for (int m = 1; m <= 2 * p + 1; ++m) {
    check_pp(Family::GPT2, pp::ScheduleKind::GPipe, p, 1, m, 0, 1, 1);
    check_pp(Family::Llama, pp::ScheduleKind::OneFOneB, p, 1, m, 0, 1, 1);
    if (m % p == 0) check_pp(Family::GPT2, pp::ScheduleKind::Interleaved, p, 2, m, 0, 1, 1);
  }
}

TEST(PipelineParallel, BadInputIsAClearError) {
  EXPECT_THROW(pp::assign_layers(5, 2), Error);        // 5 layers over 2 stages
  EXPECT_THROW(pp::make_interleaved(2, 3, 2), Error);  // m % p != 0
  comm::ParallelDims dims;
  dims.pp = world_size();
  comm::ProcessGroups pg(comm::world(), dims);
  ModelConfig cfg = pp_model(Family::GPT2, 2 * world_size());
  Decoder model(cfg, cpu_backend(), Recompute::None, DType::F32, {}, {},
                pipeline_stage_of(pp::assign_layers(cfg.n_layer, world_size()), pg.pp().rank()));
  // A schedule for another pipeline size is refused.
  EXPECT_THROW(PipelineRunner(model, pg.pp(), pp::make_gpipe(world_size() + 1, 2)), Error);
}

LOOM_MPI_TEST_MAIN()
