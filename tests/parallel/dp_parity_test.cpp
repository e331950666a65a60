// Data parallelism and ZeRO-1/2/3 against one process, as real MPI jobs (mpirun -n 2 and -n 4):
// per-step losses over 10 optimizer steps within 1e-5 relative, reduced gradients after the
// first step within 1e-5 of the largest gradient, global-norm clipping counting every element
// once, gradient accumulation reducing only on the last micro-batch.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"
#include "mpi_main.h"
#include "parallel/data_parallel.h"
#include "parity_util.h"

using namespace loom;
using namespace loom::parallel;
using namespace loom::testing_parallel;

namespace {

// Resets this process's peak resident set size to its current one (Linux: clear_refs 5).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.close();
  return !f.fail();
}

// The peak resident set size (VmHWM) in bytes.
int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

ModelConfig dp_model(Family f) {
  // Odd widths: the flat buffer, and most tensors, do not divide by the DP size.
  return f == Family::GPT2 ? tiny_model(f, 33, 3, 3, 11) : tiny_model(f, 33, 3, 1, 8);
}

struct DpRun {
  StepLog log;
  std::vector<float> first_grads_owned;  // reduced grads of step 0 on [shard_begin, shard_end)
  int64_t lo = 0, hi = 0;
  size_t buckets = 0;
  int64_t started = 0, started_in_backward = 0;
};

// engine_draws: the model comes uninitialised and the engine draws its weights (the trainer's
// way; under ZeRO-3 only what each rank keeps).
DpRun dp_run(const ModelConfig& cfg, int zero, bool overlap, int64_t bucket_elems,
             bool engine_draws) {
  comm::Communicator& dp = comm::world();
  const int D = dp.size(), r = dp.rank();
  Decoder m(cfg, cpu_backend());
  DataParallelOptions o;
  o.zero = zero;
  o.overlap = overlap;
  o.bucket_elems = bucket_elems;
  if (engine_draws)
    o.init_seed = 5;
  else
    m.params().init(5);
  DataParallel ddp(m, dp, o, parity_adamw(), DType::F32, cpu_backend());
  DpRun out;
  out.lo = ddp.shard_begin();
  out.hi = ddp.shard_end();
  out.buckets = ddp.num_buckets();
  for (int k = 0; k < kSteps; ++k) {
    std::vector<MicroBatch> mb = rank_micros(k, kMicros, D, r, cfg.vocab);
    const int64_t valid = global_valid(mb, dp);
    double loss = accumulate_micros(m, ddp, inputs(mb), 1.f / valid);
    loss = dp.all_reduce_scalar(loss, comm::ReduceOp::Sum);
    double norm = std::sqrt(dp.all_reduce_scalar(ddp.grad_sq_local(), comm::ReduceOp::Sum));
    if (k == 0) {
      const float* g = zero == 0 ? m.params().grad() + out.lo : nullptr;
      std::vector<float> owned(out.hi - out.lo);
      if (zero == 0) {
        std::memcpy(owned.data(), g, owned.size() * 4);
      } else {
        owned = ddp.reduced_grad_shard();
      }
      out.first_grads_owned = owned;
    }
    float gs = norm > kClip ? static_cast<float>(kClip / norm) : 1.f;
    ddp.step(1e-2, gs);
    out.log.losses.push_back(loss / valid);
    out.log.norms.push_back(norm);
  }
  out.started = ddp.reductions_started();
  out.started_in_backward = ddp.reductions_started_in_backward();
  ddp.sync_model_from_master();  // ZeRO-3: make the non-block parameters current
  auto& P = m.params();
  out.log.final_params.assign(P.data(), P.data() + P.total());
  return out;
}

void check_parity(Family f, int zero, bool overlap = true, int64_t bucket_elems = 3000,
                  bool engine_draws = false) {
  ModelConfig cfg = dp_model(f);
  const int D = comm::world().size();
  StepLog ref = reference_run(cfg, kSteps, kMicros * D, kRows, kT);
  DpRun run = dp_run(cfg, zero, overlap, bucket_elems, engine_draws);
  ASSERT_EQ(run.log.losses.size(), ref.losses.size());
  if (bucket_elems < 10000) {
    EXPECT_GT(run.buckets, 2u) << "the test needs several buckets";
  }
  // Accumulation: ZeRO-0/1 reduce on the last micro-batch only, ZeRO-2/3 after each one; with
  // overlap every reduction starts inside backward, without it none does.
  const int64_t per_step = zero >= 2 ? kMicros : 1;
  EXPECT_EQ(run.started, int64_t(run.buckets) * kSteps * per_step);
  EXPECT_EQ(run.started_in_backward, overlap ? run.started : 0);
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_LT(rel_diff(run.log.losses[k], ref.losses[k]), 1e-5)
        << "step " << k << ": " << run.log.losses[k] << " vs " << ref.losses[k];
    EXPECT_LT(rel_diff(run.log.norms[k], ref.norms[k]), 1e-5) << "grad norm, step " << k;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the reference should learn";
  float gmax = 0;
  for (float g : ref.first_grads) gmax = std::max(gmax, std::fabs(g));
  for (int64_t i = run.lo; i < run.hi; ++i)
    ASSERT_NEAR(run.first_grads_owned[i - run.lo], ref.first_grads[i], 1e-5 * gmax)
        << "reduced gradient element " << i;
  // Every rank ends with the same parameters, bit for bit (ZeRO: after the all-gathers; the
  // block parameters of ZeRO-3 are gathered on demand and not compared here).
  const auto& p = run.log.final_params;
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += double(p[i]) * double(1 + i % 7);
  comm::Communicator& w = comm::world();
  EXPECT_EQ(w.all_reduce_scalar(sum, comm::ReduceOp::Max),
            -w.all_reduce_scalar(-sum, comm::ReduceOp::Max));
}

}  // namespace

TEST(DataParallel, FlatBufferDoesNotDivideByDpSize) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(dp_model(f), cpu_backend());
    EXPECT_NE(m.params().total() % comm::world().size(), 0) << "pick sizes that make it uneven";
  }
}

TEST(DataParallel, Zero0Gpt2MatchesOneProcess) {
  check_parity(Family::GPT2, 0);
}
TEST(DataParallel, Zero0LlamaMatchesOneProcess) {
  check_parity(Family::Llama, 0);
}
TEST(DataParallel, Zero0WithoutOverlapMatchesOneProcess) {
  check_parity(Family::GPT2, 0, false);
}
TEST(DataParallel, Zero1MatchesOneProcess) {
  check_parity(Family::GPT2, 1);
}
TEST(DataParallel, Zero2MatchesOneProcess) {
  check_parity(Family::Llama, 2);
}
TEST(DataParallel, Zero3MatchesOneProcess) {
  check_parity(Family::GPT2, 3);
}
TEST(DataParallel, Zero3LlamaOneBigBucketMatchesOneProcess) {
  check_parity(Family::Llama, 3, true, 1 << 30);
}
TEST(DataParallel, Zero3DrawingItsOwnWeightsMatchesOneProcess) {
  check_parity(Family::GPT2, 3, true, 3000, true);
  check_parity(Family::Llama, 3, true, 1 << 30, true);
}
TEST(DataParallel, Zero1DrawingItsOwnWeightsMatchesOneProcess) {
  check_parity(Family::Llama, 1, true, 3000, true);
}

// ZeRO-3 drawing its own weights (the trainer's way) never materialises the whole model: the
// peak resident memory of building the model and the engine is the rank's shard-sized state
// plus the parameters that stay gathered (on the old way, init() then release, it was that plus
// the whole model, twice: values and zero-filled gradients), the other ranks' block pages are
// never touched, and every parameter, gathered as the forward pass gathers it, is bit for bit
// one process's init().
TEST(DataParallel, Zero3DrawsOnlyWhatTheRankKeeps) {
  ModelConfig cfg = dp_model(Family::GPT2);
  cfg.n_layer = 4;
  cfg.d_model = 256;
  cfg.n_head = cfg.n_kv_head = 4;
  cfg.head_dim = 64;
  cfg.d_ff = 1024;
  Decoder ref(cfg, cpu_backend());
  ref.params().init(5);  // also starts the threads of fill_normal before the measurement
  const bool measured = reset_peak_rss();
  const int64_t base = peak_rss_bytes();
  Decoder m(cfg, cpu_backend());
  DataParallelOptions o;
  o.zero = 3;
  o.init_seed = 5;
  DataParallel ddp(m, comm::world(), o, parity_adamw(), DType::F32, cpu_backend());
  const int64_t growth = peak_rss_bytes() - base;

  ParamSet& P = m.params();
  const int64_t full = P.total() * 4, page = sysconf(_SC_PAGESIZE);
  const int64_t state = 4 * (ddp.shard_end() - ddp.shard_begin()) * 4;  // m, v, master, grads
  int64_t gathered = 0;  // the parameters outside the blocks
  for (const ParamInfo& p : P.infos())
    if (p.name.rfind("blocks.", 0) != 0) gathered += p.numel * 4;
  EXPECT_GT(full, 4 * gathered) << "the test needs blocks to dominate the model";
  if (measured) {
    EXPECT_LT(growth, state + gathered + full / 8)
        << "peak resident growth " << growth << " B; whole model " << full << " B, shard state "
        << state << " B, gathered parameters " << gathered << " B";
  } else {
    ADD_FAILURE() << "/proc/self/clear_refs cannot reset the peak RSS here";
  }
  EXPECT_LE(resident_bytes(P.data(), full), gathered + 4 * page);
  EXPECT_LE(resident_bytes(P.grad(), full), page);

  auto expect_same = [&](const ParamInfo& p) {
    const float* want = ref.params().ptr(p.name);
    EXPECT_EQ(std::memcmp(P.data() + p.offset, want, p.numel * 4), 0) << p.name;
  };
  for (const auto& s : ddp.param_slices())  // the master shard
    EXPECT_EQ(std::memcmp(s.tensor.data<float>(), ref.params().ptr(s.name) + s.offset,
                          s.tensor.numel() * 4),
              0)
        << "master slice of " << s.name;
  for (int l = 0; l < cfg.n_layer; ++l) {
    m.before_block(l, false);
    for (const ParamInfo& p : P.infos())
      if (p.name.rfind("blocks." + std::to_string(l) + ".", 0) == 0) expect_same(p);
    m.after_block(l, false);
  }
  for (const ParamInfo& p : P.infos())
    if (p.name.rfind("blocks.", 0) != 0) expect_same(p);
}

// Sharded state is really released: resident bytes (mincore) of gradients under ZeRO-2 and of
// parameters under ZeRO-3 drop well below the full buffer, and optimizer state shrinks with DP.
TEST(DataParallel, ShardedStateIsReleased) {
  ModelConfig cfg = dp_model(Family::GPT2);
  cfg.d_model = 96;
  cfg.n_head = cfg.n_kv_head = 3;
  cfg.head_dim = 32;
  cfg.d_ff = 384;
  cfg.vocab = 61;
  const int D = comm::world().size();
  MicroBatch b = make_micro(0, comm::world().rank() * kRows, kRows, kT, cfg.vocab);
  std::vector<MemoryUse> use;
  int64_t full = 0;
  for (int zero = 0; zero <= 3; ++zero) {
    Decoder m(cfg, cpu_backend());
    m.params().init(5);
    full = m.params().total() * 4;
    DataParallelOptions o;
    o.zero = zero;
    o.bucket_elems = 20000;
    DataParallel ddp(m, comm::world(), o, AdamWConfig{}, DType::F32, cpu_backend());
    ddp.start_step(1);
    ddp.start_micro(0);
    m.forward_backward(b.input(), 1e-3f);
    ddp.finish_micro();
    ddp.step(1e-3, 1.f);
    use.push_back(ddp.memory_use());
  }
  EXPECT_GE(use[0].grads, full);
  EXPECT_GE(use[0].optim, 2 * full);
  EXPECT_LT(use[1].optim, 2 * full / D + 3 * 4096);  // m and v of one shard
  EXPECT_LT(use[2].grads, full / D + full / 5);      // the shard, not the full buffer
  EXPECT_LT(use[3].params, full / 3);                // blocks released between uses
  EXPECT_GE(use[2].params, full);
}

LOOM_MPI_TEST_MAIN()
