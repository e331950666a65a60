// GRPO over MPI ranks (run as 2 and 3 ranks: one learner, 1 or 2 rollout ranks): after every
// weight sync each rollout rank holds the learner's weights bit for bit (hash of the flat
// buffer, fp32 and bf16); the staleness bound holds across ranks under a slowed learner and
// slowed rollouts; with max_staleness 0 and fp32 sync the run is the one-process synchronous
// run step for step. The stalled-rank test (its own CTest entry) checks that a rollout rank
// that stops answering ends the learner with an error naming it within --learner-timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "mpi_main.h"
#include "rl/grpo_trainer.h"
#include "rl/mpi_grpo.h"
#include "rl/rl_checkpoint.h"
#include "rl/weight_sync.h"
#include "rl_test_util.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::rl;

namespace {

comm::Communicator& W() {
  return comm::world();
}

MpiRlOptions mpi_options(int64_t steps, int64_t max_staleness, DType dtype) {
  MpiRlOptions m;
  m.rollout_ranks = W().size() - 1;
  m.weight_dtype = dtype;
  m.max_staleness = max_staleness;
  m.learner_timeout = 60;
  m.steps = steps;
  return m;
}

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

// Every rank's (version, hash) list, gathered on every rank: hashes[rank][i].
std::vector<std::vector<int64_t>> gather_hashes(const MpiGrpo& g, int64_t versions) {
  std::vector<int64_t> all(size_t(2 * versions * W().size()), 0);
  const auto& mine = g.weight_hashes();
  // Learner 0 sends every version and the rollout ranks take them; other learners hold none.
  if (W().rank() == 0 || !g.is_learner()) {
    EXPECT_EQ(int64_t(mine.size()), versions) << "rank " << W().rank();
  }
  for (size_t i = 0; i < mine.size() && int64_t(i) < versions; ++i) {
    all[size_t(2 * versions * W().rank()) + 2 * i] = mine[i].first;
    all[size_t(2 * versions * W().rank()) + 2 * i + 1] = int64_t(mine[i].second);
  }
  W().all_gather(all.data(), std::vector<int64_t>(size_t(W().size()), 2 * versions), DType::I64);
  std::vector<std::vector<int64_t>> out(size_t(W().size()));
  for (int r = 0; r < W().size(); ++r)
    out[size_t(r)].assign(all.begin() + 2 * versions * r, all.begin() + 2 * versions * (r + 1));
  return out;
}

// Rank 0 makes a temporary directory (held in `dir`, removed when it goes) and every rank gets
// its path: one machine, so the learners can read what rank 0 writes there.
std::string shared_temp_dir(const char* name, std::unique_ptr<test::TempDir>& dir) {
  std::vector<uint8_t> path(512, 0);
  if (W().rank() == 0) {
    dir = std::make_unique<test::TempDir>(name);
    std::memcpy(path.data(), dir->str().data(), std::min<size_t>(dir->str().size(), 511));
  }
  W().broadcast(path.data(), 512, DType::U8, 0);
  return std::string(reinterpret_cast<const char*>(path.data()));
}

// A step taken again (a resume, or the synchronous run) against the one it must equal, bit for
// bit: the reward, loss, gradient norm and trained tokens.
void expect_same_step(const RlStepStats& x, const RlStepStats& y, int64_t s) {
  EXPECT_EQ(x.reward_mean, y.reward_mean) << "step " << s;
  EXPECT_EQ(x.loss, y.loss) << "step " << s;
  EXPECT_EQ(x.grad_norm, y.grad_norm) << "step " << s;
  EXPECT_EQ(x.train_tokens, y.train_tokens) << "step " << s;
}

std::vector<float> weights_of(const ParamSet& p) {
  return std::vector<float>(p.data(), p.data() + p.total());
}

// The resumed run's weights against the uninterrupted run's, bit for bit.
void expect_resumed_weights(const std::vector<float>& full, const ParamSet& p) {
  ASSERT_EQ(int64_t(full.size()), p.total());
  EXPECT_EQ(std::memcmp(full.data(), p.data(), size_t(p.total()) * sizeof(float)), 0)
      << "the resumed run ends with other weights than the uninterrupted one";
}

}  // namespace

TEST(MpiGrpo, LayoutErrors) {
  EXPECT_NO_THROW(check_rl_layout(3, 2));
  for (int k : {0, 3, -1}) {
    try {
      check_rl_layout(3, k);
      ADD_FAILURE() << "--rollout-ranks " << k << " of 3 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must lie in [1, 2]"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(check_rl_layout(1, 1), Error);
  EXPECT_NO_THROW(check_rl_layout(4, 2));  // two data-parallel learner ranks
  EXPECT_NO_THROW(check_rl_layout(3, 1));
}

TEST(MpiGrpo, EveryRolloutRankHoldsTheLearnersWeightsAfterEachSync) {
  for (DType dt : {DType::BF16, DType::F32}) {
    rltest::Fixture f;
    const int64_t steps = 4;
    MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, rltest::small_options(),
              mpi_options(steps, 1, dt));
    if (g.is_learner()) {
      for (int64_t s = 0; s < steps; ++s) g.step();
      g.finish();
    } else {
      g.run_rollout();
    }
    // Versions 0..3 were sent (none after the last step) and taken by every rollout rank.
    const auto h = gather_hashes(g, steps);
    for (int r = 1; r < W().size(); ++r)
      for (int64_t i = 0; i < steps; ++i) {
        EXPECT_EQ(h[size_t(r)][size_t(2 * i)], i) << "rank " << r;
        EXPECT_EQ(h[size_t(r)][size_t(2 * i + 1)], h[0][size_t(2 * i + 1)])
            << dtype_name(dt) << ": rollout rank " << r << " holds other weights than the "
            << "learner sent as version " << i;
      }
    // Learning moved the weights: the hashes of successive versions differ (else equal hashes
    // would prove nothing).
    for (int64_t i = 1; i < steps; ++i)
      EXPECT_NE(h[0][size_t(2 * i + 1)], h[0][size_t(2 * i - 1)]) << "version " << i;
  }
}

TEST(MpiGrpo, WeightHashSeesOneBf16Step) {
  rltest::Fixture f;
  ParamSet& P = f.model.params();
  const uint64_t a = weights_hash(P, DType::BF16), a32 = weights_hash(P, DType::F32);
  // A change below bf16's resolution is invisible to the bf16 hash but not to the fp32 one; a
  // change of one bf16 ulp is visible to both.
  const float x = P.data()[7];
  P.data()[7] = bits_f32(f32_bits(x) + 1);
  EXPECT_EQ(weights_hash(P, DType::BF16), a);
  EXPECT_NE(weights_hash(P, DType::F32), a32);
  P.data()[7] = bits_f32(f32_bits(round_bf16(x)) + 0x10000);
  EXPECT_NE(weights_hash(P, DType::BF16), a);
}

TEST(MpiGrpo, StalenessBoundHoldsAcrossRanks) {
  // A slowed learner lets the rollout ranks run ahead (up to the bound); slowed rollouts make
  // the learner wait. Either way no group older than max_staleness is generated or trained on.
  for (int slow_learner : {1, 0}) {
    rltest::Fixture f;
    const int64_t steps = 5, S = 1;
    MpiRlOptions m = mpi_options(steps, S, DType::BF16);
    if (slow_learner)
      m.before_learn = [](int64_t) { sleep_s(0.3); };
    else
      m.before_rollout = [](int64_t) { sleep_s(0.2); };
    MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, rltest::small_options(), m);
    int64_t oldest = 0, stale_groups = 0;
    if (g.is_learner()) {
      for (int64_t s = 0; s < steps; ++s) {
        const RlStepStats st = g.step();
        EXPECT_EQ(st.groups, 3) << "step " << s;
        oldest = std::max(oldest, int64_t(st.staleness.size()) - 1);
        if (st.staleness.size() > 1) stale_groups += st.staleness[1];
      }
      g.finish();
      EXPECT_EQ(g.buffer_stats().dropped_stale, 0);
    } else {
      g.run_rollout();
      EXPECT_EQ(int64_t(g.generated_ages().size()), steps);
      for (int64_t a : g.generated_ages()) oldest = std::max(oldest, a);
    }
    EXPECT_LE(oldest, S) << "rank " << W().rank() << (slow_learner ? ", slow learner" : "");
    stale_groups = W().all_reduce_scalar(stale_groups, comm::ReduceOp::Max);
    // With a slow learner the rollout ranks do run ahead: the bound was exercised, not idle.
    if (slow_learner) {
      EXPECT_GT(stale_groups, 0) << "no stale group: the bound was not tested";
    }
  }
}

TEST(MpiGrpo, StalenessZeroReproducesTheSynchronousRun) {
  set_num_threads(1);
  const int64_t steps = 4;
  rltest::Fixture f;
  MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, rltest::small_options(),
            mpi_options(steps, 0, DType::F32));
  std::vector<RlStepStats> got;
  if (g.is_learner()) {
    for (int64_t s = 0; s < steps; ++s) got.push_back(g.step());
    g.finish();
  } else {
    g.run_rollout();
    return;
  }
  // The same run in this process, synchronously.
  rltest::Fixture ref;
  const RlOptions o = rltest::small_options();
  GrpoTrainer sync(ref.model, ref.tok, ref.chat, ref.env, o);
  int trained = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const RlStepStats x = sync.step();
    const RlStepStats& y = got[size_t(s)];
    expect_same_step(x, y, s);
    ASSERT_EQ(y.staleness.size(), 1u) << "step " << s;
    trained += x.train_tokens > 0;
  }
  EXPECT_GT(trained, 0) << "no step had a gradient: the comparison proves nothing";
  const ParamSet &pa = ref.model.params(), &pb = f.model.params();
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), size_t(pa.total()) * sizeof(float)), 0)
      << "the weights differ after " << steps << " steps";
}

// A bf16 (and an fp16) policy over ranks: the rollout ranks sample from a policy of the same
// compute type (bf16 activations, and the bf16 GEMMs where the CPU has them), on the learner's
// weights, which are values of that type; so with max staleness 0 and fp32 weight sync the run
// is the one-process synchronous run of that policy bit for bit (rewards, losses, gradient
// norms, final weights). A bf16 policy's weights are bf16 values: the default bf16 sync carries
// them exactly, and gives the same run.
TEST(MpiGrpo, ReducedPrecisionPolicyRolloutRanksEqualTheSynchronousRun) {
  set_num_threads(1);
  const int64_t steps = 3;
  for (const char* name : {"bf16", "fp16"})
    for (DType wire : {DType::F32, DType::BF16}) {
      const PrecisionPolicy prec = precision_from_name(name);
      if (prec.compute == DType::F16 && wire == DType::BF16) continue;  // (not fp16's values)
      SCOPED_TRACE(cat(name, " policy, ", dtype_name(wire), " sync"));
      RlOptions o = rltest::small_options();
      o.precision = prec;
      o.scaler.initial = 1024;
      rltest::Fixture f(rltest::tiny_config(), prec.compute);
      MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, o, mpi_options(steps, 0, wire));
      std::vector<RlStepStats> got;
      if (g.is_learner()) {
        for (int64_t s = 0; s < steps; ++s) got.push_back(g.step());
        g.finish();
      } else {
        g.run_rollout();
      }
      const auto h = gather_hashes(g, steps);
      for (int r = 1; r < W().size(); ++r)
        EXPECT_EQ(h[size_t(r)], h[0]) << "rollout rank " << r << " holds other weights";
      if (!g.is_learner()) continue;
      rltest::Fixture ref(rltest::tiny_config(), prec.compute);
      GrpoTrainer sync(ref.model, ref.tok, ref.chat, ref.env, o);
      int trained = 0;
      for (int64_t s = 0; s < steps; ++s) {
        const RlStepStats x = sync.step();
        expect_same_step(x, got[size_t(s)], s);
        trained += x.train_tokens > 0;
      }
      EXPECT_GT(trained, 0) << "no step had a gradient: the comparison proves nothing";
      expect_resumed_weights(weights_of(ref.model.params()), f.model.params());
    }
}

// 3 ranks as 2 data-parallel learners + 1 rollout rank, their optimizer at ZeRO-1, ZeRO-2 and
// ZeRO-3 (optimizer state, at ZeRO-2 gradients, at ZeRO-3 parameters too sharded over the
// learners; ZeRO-1/2 all-gather the parameters after each step, ZeRO-3 gathers each block
// around its use and the whole weights for the weight sync after each step): the steps and
// weights of ZeRO-0, bit for bit (each element's sum and AdamW update are the same operations
// on the same values, only on one learner instead of both; ZeRO-3's forward reads the same
// values, gathered). The rollout rank receives the same weights every version (the whole
// gathered parameters: their hashes equal ZeRO-0's), and both learners hold them.
TEST(MpiGrpo, ZeroOneTwoAndThreeLearnersEqualZeroZero) {
  if (W().size() != 3) GTEST_SKIP() << "runs as 3 ranks (2 learners + 1 rollout rank)";
  set_num_threads(1);
  const int64_t steps = 4;
  struct Result {
    std::vector<RlStepStats> st;
    std::vector<std::vector<int64_t>> versions;  // every rank's (version, hash) list
    std::vector<int64_t> hash;                   // every rank's final weights
  };
  auto run = [&](int zero) {
    rltest::Fixture f;
    MpiRlOptions m = mpi_options(steps, 0, DType::F32);
    m.rollout_ranks = 1;
    RlOptions o = rltest::small_options();
    o.zero = zero;
    MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, o, m);
    Result r;
    if (g.is_learner()) {
      for (int64_t s = 0; s < steps; ++s) r.st.push_back(g.step());
      g.finish();
    } else {
      g.run_rollout();
    }
    r.versions = gather_hashes(g, steps);
    r.hash.assign(3, 0);
    r.hash[size_t(W().rank())] = int64_t(weights_hash(f.model.params(), DType::F32));
    W().all_gather(r.hash.data(), std::vector<int64_t>(3, 1), DType::I64);
    return r;
  };
  const Result z0 = run(0);
  for (int zero : {1, 2, 3}) {
    SCOPED_TRACE(cat("ZeRO-", zero));
    const Result z = run(zero);
    if (W().rank() != 0) continue;
    int trained = 0;
    for (int64_t s = 0; s < steps; ++s) {
      expect_same_step(z0.st[size_t(s)], z.st[size_t(s)], s);
      trained += z0.st[size_t(s)].train_tokens > 0;
    }
    EXPECT_GT(trained, 0) << "no step had a gradient: the comparison proves nothing";
    EXPECT_EQ(z.versions[1], z0.versions[1])
        << "the rollout rank received other weights than under ZeRO-0";
    EXPECT_EQ(z.versions[1], z.versions[0]) << "the rollout rank holds other weights than sent";
    EXPECT_EQ(z.hash[0], z0.hash[0]) << "the final weights differ from ZeRO-0's";
    EXPECT_EQ(z.hash[2], z.hash[0]) << "the two learners hold different whole weights";
  }
}

// A checkpoint of ZeRO learners holds the whole optimizer state, all-gathered from the shards
// (the one-learner layout; under bf16 the fp32 master too), and a resume cuts each learner's
// shard from it: 2 learners + 1 rollout rank, saved after 2 of 4 steps under one ZeRO stage and
// resumed under another, end with the uninterrupted run's steps and weights bit for bit (every
// stage takes ZeRO-0's steps).
TEST(MpiGrpo, ZeroLearnersResumeBitForBitAcrossStages) {
  if (W().size() != 3) GTEST_SKIP() << "runs as 3 ranks (2 learners + 1 rollout rank)";
  set_num_threads(1);
  const int64_t steps = 4, cut = 2;
  struct Case {
    int zs, zr;  // the ZeRO stage saved at, resumed at
    const char* precision;
  };
  // (Under bf16 ZeRO-3 multiplies without the bf16 GEMMs, so it resumes at ZeRO-3 only.)
  for (auto [zs, zr, precision] : std::vector<Case>{{1, 1, "fp32"},
                                                    {3, 3, "fp32"},
                                                    {3, 0, "fp32"},
                                                    {0, 3, "fp32"},
                                                    {2, 1, "fp32"},
                                                    {1, 2, "bf16"},
                                                    {3, 3, "bf16"}}) {
    SCOPED_TRACE(cat("saved at ZeRO-", zs, ", resumed at ZeRO-", zr, ", ", precision));
    const PrecisionPolicy prec = precision_from_name(precision);
    MpiRlOptions m = mpi_options(steps, 0, DType::F32);
    m.rollout_ranks = 1;
    m.save_every = cut;
    std::unique_ptr<test::TempDir> dir;
    const std::string root = shared_temp_dir("rl_mpi_zero_ckpt", dir) + "/ckpt";
    RlCheckpointInfo info;
    info.description = "test";
    info.precision = precision;
    std::vector<RlStepStats> full;
    std::vector<float> full_weights;
    {
      rltest::Fixture a(rltest::tiny_config(), prec.compute);
      info.fingerprint = a.model.config().fingerprint();
      RlOptions o = rltest::small_options();
      o.zero = zs;
      o.precision = prec;
      MpiGrpo g(W(), a.model, a.tok, a.chat, a.env, o, m);
      if (g.is_learner()) {
        for (int64_t s = 0; s < steps; ++s) {
          full.push_back(g.step());
          if (s + 1 == cut && W().rank() == 0)
            save_rl_checkpoint(root, cut, info, a.model, g.checkpoint_optimizer(), {});
        }
        g.finish();
        full_weights = weights_of(a.model.params());
      } else {
        g.run_rollout();
      }
    }
    W().barrier();  // the checkpoint is on disk before any rank opens it
    rltest::Fixture c(rltest::tiny_config(), prec.compute);
    RlRestore restore;
    if (W().rank() != 1) {  // the learners
      const std::string latest = ckpt::find_latest_checkpoint(root).value_or(root);
      restore = open_rl_checkpoint(latest, c.model.config().fingerprint()).restore;
    }
    RlOptions o = rltest::small_options();
    o.zero = zr;
    o.precision = prec;
    MpiGrpo g(W(), c.model, c.tok, c.chat, c.env, o, m, restore);
    if (!g.is_learner()) {
      g.run_rollout();
      W().barrier();
      continue;
    }
    EXPECT_EQ(g.first_step(), cut);
    int trained = 0;
    for (int64_t s = cut; s < steps; ++s) {
      const RlStepStats y = g.step(), &x = full[size_t(s)];
      expect_same_step(x, y, s);
      trained += y.train_tokens > 0;
    }
    EXPECT_GT(trained, 0) << "no resumed step had a gradient: the comparison proves nothing";
    g.finish();
    expect_resumed_weights(full_weights, c.model.params());
    W().barrier();  // rank 0's temp dir goes after every learner has read it
  }
}

// 3 ranks as 2 data-parallel learners (world ranks 0 and 2) + 1 rollout rank: the same steps as
// one learner on all the groups (the synchronous run in this process, max staleness 0, fp32
// weight sync), up to the order of the gradient sums; both learners hold the same weights.
TEST(MpiGrpo, TwoLearnersTakeOneLearnersSteps) {
  if (W().size() != 3) GTEST_SKIP() << "runs as 3 ranks (2 learners + 1 rollout rank)";
  set_num_threads(1);
  const int64_t steps = 4;
  rltest::Fixture f;
  std::vector<float> w0(f.model.params().data(),
                        f.model.params().data() + f.model.params().total());
  MpiRlOptions m = mpi_options(steps, 0, DType::F32);
  m.rollout_ranks = 1;
  MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, rltest::small_options(), m);
  std::vector<RlStepStats> got;
  if (g.is_learner()) {
    for (int64_t s = 0; s < steps; ++s) got.push_back(g.step());
    g.finish();
  } else {
    g.run_rollout();
  }
  // Every rank's weight hash: the learners' (ranks 0 and 2) must be equal, bit for bit.
  std::vector<int64_t> h(3, 0);
  h[size_t(W().rank())] = int64_t(weights_hash(f.model.params(), DType::F32));
  W().all_gather(h.data(), std::vector<int64_t>(3, 1), DType::I64);
  if (W().rank() != 0) return;
  EXPECT_EQ(h[0], h[2]) << "the two learners' weights differ";
  rltest::Fixture ref;
  const RlOptions o = rltest::small_options();
  GrpoTrainer sync(ref.model, ref.tok, ref.chat, ref.env, o);
  int trained = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const RlStepStats x = sync.step();
    const RlStepStats& y = got[size_t(s)];
    // The samples are the same (from weights equal up to the last bits): the counts exact, the
    // reward mean up to the order of its sum.
    EXPECT_NEAR(x.reward_mean, y.reward_mean, 1e-12) << "step " << s;
    EXPECT_NEAR(x.response_length, y.response_length, 1e-12) << "step " << s;
    EXPECT_EQ(x.groups, y.groups) << "step " << s;
    EXPECT_EQ(x.zero_advantage_groups, y.zero_advantage_groups) << "step " << s;
    EXPECT_EQ(x.train_tokens, y.train_tokens) << "step " << s;
    EXPECT_EQ(x.staleness, y.staleness) << "step " << s;
    // Loss and gradient norm see the whole step's normalisation (a share normalised by its own
    // tokens would be off by about 2x).
    EXPECT_NEAR(x.loss, y.loss, 1e-6 * (1 + std::abs(x.loss))) << "step " << s;
    EXPECT_NEAR(x.grad_norm, y.grad_norm, 1e-5 * x.grad_norm) << "step " << s;
    EXPECT_NEAR(x.entropy, y.entropy, 1e-6 * x.entropy) << "step " << s;
    EXPECT_NEAR(x.kl, y.kl, 1e-9 + 1e-5 * x.kl) << "step " << s;
    trained += x.train_tokens > 0;
  }
  EXPECT_GT(trained, 0) << "no step had a gradient: the comparison proves nothing";
  // The weights: apart by far less than the steps moved them.
  const float *a = ref.model.params().data(), *b = f.model.params().data();
  double diff = 0, moved = 0;
  for (int64_t i = 0; i < ref.model.params().total(); ++i) {
    diff += double(a[i] - b[i]) * double(a[i] - b[i]);
    moved += double(a[i] - w0[size_t(i)]) * double(a[i] - w0[size_t(i)]);
  }
  EXPECT_GT(moved, 0.0);
  EXPECT_LT(std::sqrt(diff), 1e-3 * std::sqrt(moved))
      << "|w_dp - w_one| = " << std::sqrt(diff) << ", |w_one - w_start| = " << std::sqrt(moved);
  std::printf("2 learners vs 1: |w_dp - w_one| / |w_one - w_start| = %.3g\n",
              std::sqrt(diff / moved));
}

// 3 ranks as 2 tensor-parallel learners (world ranks 0 and 2, one TP group of 2) + 1 rollout
// rank, and 5 ranks as 2 data-parallel groups of 2 TP learners (world ranks 0, 2 and 3, 4) + 1
// rollout rank: the same steps as one learner on all the groups (the synchronous run in this
// process, max staleness 0, fp32 weight sync). TP splits the matrix products' sums (the row-
// parallel all-reduce adds two partial sums), so the weights agree up to that reordering, not
// bit for bit: the counts and the first step's rewards (from the same starting weights) are
// exact, the rest within the tolerances below. Both TP ranks of learner 0's group assemble the
// same whole weights from their shards, the rollout rank receives exactly them, and the same TP
// rank of each data-parallel group holds the same shard.
// The same with sequence parallelism in the TP groups (passes padded to an even token count),
// and with a MoE policy (experts replicated over the TP group; under SP without the auxiliary
// loss, which the padding would change), within the same tolerances.
// With expert parallelism (ep = 2: the experts split over the 2 learner ranks, or the 2 data-
// parallel TP groups) and expert tensor parallelism (etp = 2: each expert's width split over
// the TP group) the same, within the same tolerances: the whole weights every learner of the
// first EP group assembles are the same bits; EP ranks hold other experts.
struct LearnerLayout {
  int tp = 2, ep = 1, etp = 1;
  bool sp = false;
};

// Under a bf16 or fp16 policy (opt.precision) both sides keep an fp32 master and round the
// policy's copy from it; a sum in another order can flip a rounding of the compute type, so the
// statistics are held to that format's tolerance, 1e-2 relative (the trainer's reduced-
// precision parity, TrainerDp.ReducedPrecisionPoliciesMatchOneProcess), over 3 steps: a flipped
// rounding moves a weight by an ulp of the compute type, which can flip a sampled token, and the
// runs then train on other samples (so the rewards are compared at step 0 only, and the run is
// kept short; the test prints in how many steps the samples were the same). The weights are held
// to half of their motion only: AdamW's first steps are nearly sign(g) * lr, so an element whose
// gradient is near zero moves by a whole step either way on a rounding of a bf16 activation in
// TP's split sums (measured: bf16 TP 0.18, fp16 TP 7e-3, EP 3e-5).
static void check_tp_learners(bool sp, const ModelConfig& cfg, const char* what,
                              const RlOptions& opt = rltest::small_options(),
                              LearnerLayout layout = {}) {
  set_num_threads(1);
  const bool reduced = opt.precision.compute != DType::F32;
  const int64_t steps = reduced ? 3 : 4;
  const double stat_tol = reduced ? 1e-2 : 1e-5, weight_tol = reduced ? 0.5 : 1e-3;
  rltest::Fixture f(cfg, opt.precision.compute);
  std::vector<float> w0(f.model.params().data(),
                        f.model.params().data() + f.model.params().total());
  MpiRlOptions m = mpi_options(steps, 0, DType::F32);
  m.rollout_ranks = 1;
  m.learner_tp = layout.tp;
  m.learner_ep = layout.ep;
  m.learner_etp = layout.etp;
  m.learner_sp = sp;
  MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, opt, m);
  std::vector<RlStepStats> got;
  if (g.is_learner()) {
    for (int64_t s = 0; s < steps; ++s) got.push_back(g.step());
    g.finish();
  } else {
    g.run_rollout();
  }
  // The versions the rollout rank took are the ones learner 0 sent (hashes of the whole model).
  const auto hashes = gather_hashes(g, steps);
  EXPECT_EQ(hashes[0], hashes[1]) << "the rollout rank's weights differ from the learner's";
  // The whole weights learner 0's TP group assembled after the last step (world ranks 0 and
  // 2): equal, bit for bit; with 2 data-parallel groups, each TP rank's shard equal to its
  // counterpart's (world ranks 0 and 3, 2 and 4).
  const int n = W().size();
  std::vector<int64_t> h(size_t(2 * n), 0);
  h[size_t(2 * W().rank())] = int64_t(weights_hash(f.model.params(), DType::F32));
  if (g.is_learner())
    h[size_t(2 * W().rank() + 1)] = int64_t(weights_hash(g.trained_model().params(), DType::F32));
  W().all_gather(h.data(), std::vector<int64_t>(size_t(n), 2), DType::I64);
  if (W().rank() != 0) return;
  EXPECT_EQ(h[0], h[4]) << "learners 0 and 1 assembled different whole weights";
  EXPECT_NE(h[1], h[5]) << "learners 0 and 1 (other TP or EP ranks) hold the same shard";
  if (n == 5 && layout.ep == 1) {
    EXPECT_EQ(h[1], h[7]) << "TP rank 0 of the two data-parallel groups differs";
    EXPECT_EQ(h[5], h[9]) << "TP rank 1 of the two data-parallel groups differs";
  }
  if (n == 5 && layout.ep == 2) {
    // Both data-parallel groups form the first EP group: all four assemble the whole model;
    // the two groups hold other experts.
    EXPECT_EQ(h[0], h[6]) << "EP rank 1's learners assembled other whole weights";
    EXPECT_EQ(h[0], h[8]) << "EP rank 1's learners assembled other whole weights";
    EXPECT_NE(h[1], h[7]) << "the two EP ranks hold the same experts";
  }
  rltest::Fixture ref(cfg, opt.precision.compute);
  GrpoTrainer sync(ref.model, ref.tok, ref.chat, ref.env, opt);
  int trained = 0, same_samples = 0;
  double worst_loss = 0, worst_norm = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const RlStepStats x = sync.step();
    const RlStepStats& y = got[size_t(s)];
    if (s == 0 && (n - 1) / layout.tp == 1) {  // (2 data-parallel groups sum in another order)
      EXPECT_EQ(x.reward_mean, y.reward_mean) << "the same starting weights";
    }
    EXPECT_EQ(x.groups, y.groups) << "step " << s;
    same_samples += x.reward_mean == y.reward_mean && x.train_tokens == y.train_tokens;
    if (!reduced || s == 0) {
      EXPECT_NEAR(x.reward_mean, y.reward_mean, 1e-12) << "step " << s;
      EXPECT_EQ(x.zero_advantage_groups, y.zero_advantage_groups) << "step " << s;
      EXPECT_EQ(x.train_tokens, y.train_tokens) << "step " << s;
    }
    EXPECT_NEAR(x.loss, y.loss, stat_tol * (1 + std::abs(x.loss))) << "step " << s;
    EXPECT_NEAR(x.grad_norm, y.grad_norm, 10 * stat_tol * x.grad_norm) << "step " << s;
    EXPECT_NEAR(x.entropy, y.entropy, stat_tol * x.entropy) << "step " << s;
    EXPECT_NEAR(x.kl, y.kl, 1e-9 + 10 * stat_tol * x.kl) << "step " << s;
    worst_loss = std::max(worst_loss, std::abs(x.loss - y.loss) / (1 + std::abs(x.loss)));
    if (x.grad_norm > 0)
      worst_norm = std::max(worst_norm, std::abs(x.grad_norm - y.grad_norm) / x.grad_norm);
    trained += x.train_tokens > 0;
  }
  EXPECT_GT(trained, 0) << "no step had a gradient: the comparison proves nothing";
  const float *a = ref.model.params().data(), *b = f.model.params().data();
  double diff = 0, moved = 0;
  for (int64_t i = 0; i < ref.model.params().total(); ++i) {
    diff += double(a[i] - b[i]) * double(a[i] - b[i]);
    moved += double(a[i] - w0[size_t(i)]) * double(a[i] - w0[size_t(i)]);
  }
  EXPECT_GT(moved, 0.0);
  EXPECT_LT(std::sqrt(diff), weight_tol * std::sqrt(moved))
      << "|w_tp - w_one| = " << std::sqrt(diff) << ", |w_one - w_start| = " << std::sqrt(moved);
  std::printf(
      "%d x TP %d, EP %d, ETP %d (%s, %s) vs 1 learner: |w_tp - w_one| / |w_one - w_start| = "
      "%.3g, loss %.3g, grad norm %.3g (relative); the same samples in %d of %d steps\n",
      (n - 1) / layout.tp, layout.tp, layout.ep, layout.etp, what, opt.precision.name.c_str(),
      std::sqrt(diff / moved), worst_loss, worst_norm, same_samples, int(steps));
}

// Groups of 5 completions: batches of an odd number of sequences of mostly odd lengths, so
// that the learners' passes need the padding that splits their tokens over 2 SP ranks. (Groups
// of 3 at this learning rate make a run whose AdamW steps amplify TP's reordered sums to 1e-2
// of the weights' motion, with or without SP.)
static RlOptions odd_groups() {
  RlOptions o = rltest::small_options();
  o.group_size = 5;
  return o;
}

static bool tp_learner_world() {
  return W().size() == 3 || W().size() == 5;
}
const char* const kTpLearnerRanks =
    "runs as 3 or 5 ranks (1 or 2 groups of 2 TP learners + 1 rollout rank)";

TEST(MpiGrpo, TensorParallelLearnersTakeOneLearnersSteps) {
  if (!tp_learner_world()) GTEST_SKIP() << kTpLearnerRanks;
  check_tp_learners(false, rltest::tiny_config(), "dense");
}

TEST(MpiGrpo, TensorParallelSequenceParallelLearnersTakeOneLearnersSteps) {
  if (!tp_learner_world()) GTEST_SKIP() << kTpLearnerRanks;
  check_tp_learners(true, rltest::tiny_config(), "dense, SP", odd_groups());
}

TEST(MpiGrpo, TensorParallelMoeLearnersTakeOneLearnersSteps) {
  if (!tp_learner_world()) GTEST_SKIP() << kTpLearnerRanks;
  ModelConfig c = rltest::tiny_moe_config();
  // The auxiliary loss is a function of a pass's routing statistics, not a sum over tokens:
  // two data-parallel groups, each routing its share of the groups, do not take one learner's
  // step on the whole batch (as the trainer's micro-batches route apart). One TP group keeps it.
  if (W().size() == 5) c.aux_loss_coeff = 0;
  check_tp_learners(false, c, "MoE");
}

TEST(MpiGrpo, TensorParallelSequenceParallelMoeLearnersTakeOneLearnersSteps) {
  if (!tp_learner_world()) GTEST_SKIP() << kTpLearnerRanks;
  ModelConfig c = rltest::tiny_moe_config();
  c.aux_loss_coeff = 0;
  check_tp_learners(true, c, "MoE, SP", odd_groups());
}

// Expert parallelism inside the learners: 3 ranks as 2 learners whose data-parallel groups (one
// learner each) split the 4 experts, 5 ranks as 2 TP groups of 2 splitting them; one learner's
// steps. Two data-parallel groups route their shares apart, so the auxiliary loss (a function
// of a pass's routing statistics) differs from one learner's on the whole batch: set to 0 here
// (docs/rl.md).
TEST(MpiGrpo, ExpertParallelMoeLearnersTakeOneLearnersSteps) {
  if (!tp_learner_world()) GTEST_SKIP() << kTpLearnerRanks;
  ModelConfig c = rltest::tiny_moe_config();
  c.aux_loss_coeff = 0;
  LearnerLayout l;
  l.tp = W().size() == 3 ? 1 : 2;
  l.ep = 2;
  check_tp_learners(false, c, "MoE, EP", rltest::small_options(), l);
}

// Expert tensor parallelism: each expert's width split over the TP group (with one TP group the
// auxiliary loss is one learner's), and over 5 ranks together with EP.
TEST(MpiGrpo, ExpertTensorParallelMoeLearnersTakeOneLearnersSteps) {
  if (!tp_learner_world()) GTEST_SKIP() << kTpLearnerRanks;
  ModelConfig c = rltest::tiny_moe_config();
  LearnerLayout l;
  l.etp = 2;
  if (W().size() == 5) {
    c.aux_loss_coeff = 0;
    l.ep = 2;
  }
  check_tp_learners(false, c, W().size() == 5 ? "MoE, EP + ETP" : "MoE, ETP",
                    rltest::small_options(), l);
}

// bf16 and fp16 (loss-scaled) policies in TP and EP learners: the shards compute in the
// policy's type, the engine keeps their fp32 master (the trainer's recipe, applied to the
// shard), the rollout rank samples from a policy of that type; one learner's steps of the same
// precision within that format's tolerance (check_tp_learners).
TEST(MpiGrpo, ReducedPrecisionTensorAndExpertParallelLearnersTakeOneLearnersSteps) {
  if (!tp_learner_world()) GTEST_SKIP() << kTpLearnerRanks;
  for (const char* name : {"bf16", "fp16"}) {
    RlOptions o = rltest::small_options();
    o.precision = precision_from_name(name);
    o.scaler.initial = 1024;
    check_tp_learners(false, rltest::tiny_config(), "dense", o);
    ModelConfig c = rltest::tiny_moe_config();
    c.aux_loss_coeff = 0;
    LearnerLayout l;
    l.tp = W().size() == 3 ? 1 : 2;
    l.ep = 2;
    check_tp_learners(false, c, "MoE, EP", o, l);
  }
}

// A bf16 policy's TP learners stopped after 2 steps and resumed: the checkpoint holds the whole
// master (gathered from the shards' masters) beside the rounded weights, and the resumed run is
// the uninterrupted one bit for bit.
TEST(MpiGrpo, Bf16TensorParallelLearnersResumeBitForBit) {
  if (W().size() != 3) GTEST_SKIP() << "runs as 3 ranks (2 TP learners + 1 rollout rank)";
  set_num_threads(1);
  const int64_t steps = 4, cut = 2;
  const ModelConfig cfg = rltest::tiny_config();
  MpiRlOptions m = mpi_options(steps, 0, DType::F32);
  m.rollout_ranks = 1;
  m.learner_tp = 2;
  m.save_every = cut;
  RlOptions o = rltest::small_options();
  o.precision = precision_from_name("bf16");
  std::unique_ptr<test::TempDir> dir;
  const std::string root = shared_temp_dir("rl_mpi_tp_bf16_ckpt", dir) + "/ckpt";
  RlCheckpointInfo info;
  info.description = "test";
  info.precision = "bf16";
  std::vector<RlStepStats> full;
  std::vector<float> full_weights;
  {
    rltest::Fixture a(cfg, DType::BF16);
    info.fingerprint = a.model.config().fingerprint();
    MpiGrpo g(W(), a.model, a.tok, a.chat, a.env, o, m);
    if (g.is_learner()) {
      for (int64_t s = 0; s < steps; ++s) {
        full.push_back(g.step());
        if (s + 1 == cut && W().rank() == 0) {
          const auto st = whole_state_tensors(g.checkpoint_optimizer(), a.model.params());
          EXPECT_EQ(st.count("master." + a.model.params().infos().front().name), 1u)
              << "the gathered state has no fp32 master";
          save_rl_checkpoint(root, cut, info, a.model, g.checkpoint_optimizer(), {});
        }
      }
      g.finish();
      full_weights = weights_of(a.model.params());
    } else {
      g.run_rollout();
    }
  }
  W().barrier();
  rltest::Fixture c(cfg, DType::BF16);
  RlRestore restore;
  if (W().rank() != 1)
    restore = open_rl_checkpoint(ckpt::find_latest_checkpoint(root).value_or(root),
                                 c.model.config().fingerprint())
                  .restore;
  MpiGrpo g(W(), c.model, c.tok, c.chat, c.env, o, m, restore);
  if (!g.is_learner()) {
    g.run_rollout();
    W().barrier();
    return;
  }
  EXPECT_EQ(g.first_step(), cut);
  for (int64_t s = cut; s < steps; ++s) expect_same_step(full[size_t(s)], g.step(), s);
  g.finish();
  if (W().rank() == 0) expect_resumed_weights(full_weights, c.model.params());
  W().barrier();
}

// Expert-parallel learners stopped after 2 steps and resumed from learner 0's checkpoint (the
// whole weights and optimizer moments gathered from the experts' shards, cut again at the
// resume) end with the uninterrupted run's steps and weights, bit for bit (max staleness 0,
// fp32 sync). 3 ranks: EP over 2 learners; 5 ranks: EP over 2 TP groups with ETP.
TEST(MpiGrpo, ExpertParallelLearnersResumeBitForBit) {
  if (!tp_learner_world()) GTEST_SKIP() << kTpLearnerRanks;
  set_num_threads(1);
  const int64_t steps = 4, cut = 2;
  ModelConfig cfg = rltest::tiny_moe_config();
  MpiRlOptions m = mpi_options(steps, 0, DType::F32);
  m.rollout_ranks = 1;
  m.learner_ep = 2;
  m.learner_tp = m.learner_etp = W().size() == 3 ? 1 : 2;
  m.save_every = cut;
  std::unique_ptr<test::TempDir> dir;
  const std::string root = shared_temp_dir("rl_mpi_ep_ckpt", dir) + "/ckpt";
  RlCheckpointInfo info;
  info.description = "test";
  std::vector<RlStepStats> full;
  std::vector<float> full_weights;
  {
    rltest::Fixture a(cfg);
    info.fingerprint = a.model.config().fingerprint();
    MpiGrpo g(W(), a.model, a.tok, a.chat, a.env, rltest::small_options(), m);
    if (g.is_learner()) {
      for (int64_t s = 0; s < steps; ++s) {
        full.push_back(g.step());
        if (s + 1 == cut && W().rank() == 0)
          save_rl_checkpoint(root, cut, info, a.model, g.checkpoint_optimizer(), {});
      }
      g.finish();
      full_weights = weights_of(a.model.params());
    } else {
      g.run_rollout();
    }
  }
  W().barrier();  // the checkpoint is on disk before any rank opens it
  rltest::Fixture c(cfg);
  RlRestore restore;
  if (W().rank() != 1) {  // the learners
    const std::string latest = ckpt::find_latest_checkpoint(root).value_or(root);
    RlResumePoint rp = open_rl_checkpoint(latest, c.model.config().fingerprint());
    EXPECT_EQ(rp.step, cut);
    restore = rp.restore;
  }
  MpiGrpo g(W(), c.model, c.tok, c.chat, c.env, rltest::small_options(), m, restore);
  if (!g.is_learner()) {
    g.run_rollout();
    W().barrier();
    return;
  }
  EXPECT_EQ(g.first_step(), cut);
  int trained = 0;
  for (int64_t s = cut; s < steps; ++s) {
    const RlStepStats y = g.step(), &x = full[size_t(s)];
    expect_same_step(x, y, s);
    trained += y.train_tokens > 0;
  }
  EXPECT_GT(trained, 0) << "no resumed step had a gradient: the comparison proves nothing";
  g.finish();
  if (W().rank() == 0) expect_resumed_weights(full_weights, c.model.params());
  W().barrier();  // rank 0's temp dir goes after every learner has read it
}

// A checkpoint of a multi-rank run carries the groups generated ahead of the learner: with max
// staleness 1 and a fixed lag (step s always from version s - 1, whatever the timing), fp32
// weight sync, a run saved after `cut` steps goes on to the end; a run resumed from that
// checkpoint (fresh models and optimizers, the saved groups of step `cut`, made by version
// cut - 1) takes the same steps and ends with the same weights, bit for bit. Run as 2 ranks (1
// learner) and 3 (2 data-parallel learners + 1 rollout rank).
TEST(MpiGrpo, ResumeTrainsOnTheCheckpointsBufferedGroups) {
  set_num_threads(1);
  const int64_t steps = 5, cut = 2;
  MpiRlOptions m = mpi_options(steps, 1, DType::F32);
  m.rollout_ranks = 1;
  m.fixed_lag = true;
  // Rank 0 writes the checkpoint; every learner restores from it (one machine).
  std::unique_ptr<test::TempDir> dir;
  const std::string root = shared_temp_dir("rl_mpi_ckpt", dir) + "/ckpt";
  RlCheckpointInfo info;
  info.description = "test";
  info.max_staleness = 1;
  std::vector<RlStepStats> full;
  std::vector<float> full_weights;
  int64_t buffered = 0;
  std::string saved;
  {
    rltest::Fixture a;
    info.fingerprint = a.model.config().fingerprint();
    MpiGrpo g(W(), a.model, a.tok, a.chat, a.env, rltest::small_options(), m);
    if (g.is_learner()) {
      for (int64_t s = 0; s < steps; ++s) {
        full.push_back(g.step());
        if (s + 1 != cut || W().rank() != 0) continue;
        const std::vector<BufferedStep> buf = g.buffer_contents();
        ASSERT_EQ(buf.size(), 1u) << "max staleness 1: the groups of step " << cut;
        EXPECT_EQ(buf[0].target_step, cut);
        for (const BufferedStep& b : buf)
          for (const PromptGroup& x : b.groups) {
            EXPECT_EQ(x.version, cut - 1) << "fixed lag: made by the weights before the cut";
            ++buffered;
          }
        saved = save_rl_checkpoint(root, cut, info, a.model, g.learner().optimizer(), buf);
      }
      g.finish();
      full_weights = weights_of(a.model.params());
    } else {
      g.run_rollout();
    }
  }
  W().barrier();  // the checkpoint is on disk before any rank opens it
  if (W().rank() == 0) {
    EXPECT_EQ(buffered,
              rltest::small_options().prompts_per_step - full[size_t(cut)].dropped_timeout)
        << "the checkpoint holds no buffered groups";
    // Step `cut` trained on one-step-old groups: a regenerated (version cut) step would differ.
    ASSERT_EQ(full[size_t(cut)].staleness.size(), 2u);
    EXPECT_GT(full[size_t(cut)].staleness[1], 0);
  }
  rltest::Fixture c;
  RlRestore restore;
  MpiRlOptions mr = m;
  if (W().rank() != 1) {  // the learners
    const std::string latest = ckpt::find_latest_checkpoint(root).value_or(root);
    RlResumePoint rp = open_rl_checkpoint(latest, c.model.config().fingerprint());
    EXPECT_EQ(rp.step, cut);
    restore = rp.restore;
    if (W().rank() == 0) mr.resume_buffer = rp.buffer;
  }
  MpiGrpo g(W(), c.model, c.tok, c.chat, c.env, rltest::small_options(), mr, restore);
  if (!g.is_learner()) {
    EXPECT_EQ(g.first_step(), cut + 1) << "the rollouts start after the buffered step";
    g.run_rollout();
    W().barrier();
    return;
  }
  EXPECT_EQ(g.first_step(), cut);
  for (int64_t s = cut; s < steps; ++s) {
    const RlStepStats y = g.step(), &x = full[size_t(s)];
    expect_same_step(x, y, s);
    EXPECT_EQ(x.staleness, y.staleness) << "step " << s;
  }
  g.finish();
  expect_resumed_weights(full_weights, c.model.params());
  W().barrier();  // rank 0's temp dir goes after every learner has read it
}

// Partial rollouts over ranks: 5-token completions in slices of 3 (two batches, so new groups
// start 0 steps ahead at max staleness 1); a rollout rank carries its cut groups to its next
// batch, which continues them on the next weights. Trained completions span two versions, no
// group passes the bound or is dropped as stale, and the first step trains on fewer groups
// (those that stopped within 3 tokens).
TEST(MpiGrpo, PartialRolloutsSpanWeightVersions) {
  rltest::Fixture f;
  RlOptions o = rltest::small_options();
  o.partial_tokens = 3;
  const int64_t steps = 4;
  MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, o, mpi_options(steps, 1, DType::BF16));
  if (!g.is_learner()) {
    g.run_rollout();
    for (int64_t a : g.generated_ages()) EXPECT_EQ(a, 0) << "new groups start 0 steps ahead";
    return;
  }
  int64_t spanning = 0, groups = 0, first = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const RlStepStats st = g.step();
    spanning += st.spanning_rollouts;
    groups += st.groups;
    if (s == 0) first = st.groups;
    EXPECT_LE(st.staleness.size(), 2u) << "step " << s << ": a group older than 1 step";
  }
  g.finish();
  EXPECT_GT(spanning, 0) << "no trained completion spans two weight versions";
  EXPECT_LT(first, o.prompts_per_step) << "step 0 trained on groups that were all cut";
  EXPECT_GT(groups, first);
  EXPECT_EQ(g.buffer_stats().dropped_stale, 0);
}

// Partial rollouts in a multi-rank checkpoint: 5-token completions in slices of 3 (two batches:
// at max staleness 1 new groups start 0 steps ahead, so a rollout rank makes batch s from exactly
// version s, whatever the timing), fp32 weight sync. The checkpoint after `cut` steps holds the
// groups the rollout ranks had cut and not finished; a run resumed from it (fresh objects) hands
// each rollout rank its share back, and takes the uninterrupted run's steps bit for bit. Run as
// 2 and 3 ranks (1 learner + 1 or 2 rollout ranks).
TEST(MpiGrpo, PartialRolloutsResumeTheirCutGroups) {
  set_num_threads(1);
  RlOptions o = rltest::small_options();
  o.partial_tokens = 3;
  const int64_t steps = 5, cut = 2;
  const MpiRlOptions m = mpi_options(steps, 1, DType::F32);
  std::unique_ptr<test::TempDir> dir;
  const std::string root = shared_temp_dir("rl_mpi_partial_ckpt", dir) + "/ckpt";
  RlCheckpointInfo info;
  info.description = "test";
  info.max_staleness = 1;
  std::vector<RlStepStats> full;
  std::vector<float> full_weights;
  std::vector<PromptGroup> cut_groups;
  {
    rltest::Fixture a;
    info.fingerprint = a.model.config().fingerprint();
    MpiGrpo g(W(), a.model, a.tok, a.chat, a.env, o, m);
    if (g.is_learner()) {
      for (int64_t s = 0; s < steps; ++s) {
        full.push_back(g.step());
        if (s + 1 != cut) continue;
        const std::vector<BufferedStep> buf = g.buffer_contents(&cut_groups);
        EXPECT_TRUE(buf.empty()) << "lead 0: nothing generated ahead of the weights";
        save_rl_checkpoint(root, cut, info, a.model, g.learner().optimizer(), buf, cut_groups);
      }
      g.finish();
      full_weights = weights_of(a.model.params());
    } else {
      g.run_rollout();
    }
  }
  W().barrier();  // the checkpoint is on disk before rank 0 opens it
  rltest::Fixture c;
  RlRestore restore;
  MpiRlOptions mr = m;
  if (W().rank() == 0) {
    ASSERT_FALSE(cut_groups.empty()) << "no completion was cut: the test proves nothing";
    for (const PromptGroup& x : cut_groups) EXPECT_EQ(x.target_step, cut);
    RlResumePoint rp = open_rl_checkpoint(ckpt::find_latest_checkpoint(root).value_or(root),
                                          c.model.config().fingerprint());
    EXPECT_EQ(rp.carried.size(), cut_groups.size());
    restore = rp.restore;
    mr.resume_carry = rp.carried;
  }
  MpiGrpo g(W(), c.model, c.tok, c.chat, c.env, o, mr, restore);
  if (!g.is_learner()) {
    g.run_rollout();
    W().barrier();
    return;
  }
  for (int64_t s = cut; s < steps; ++s) {
    const RlStepStats y = g.step(), &x = full[size_t(s)];
    expect_same_step(x, y, s);
    EXPECT_EQ(x.groups, y.groups) << "step " << s;
    EXPECT_EQ(x.staleness, y.staleness) << "step " << s;
    EXPECT_EQ(x.spanning_rollouts, y.spanning_rollouts) << "step " << s;
  }
  g.finish();
  expect_resumed_weights(full_weights, c.model.params());
  W().barrier();  // rank 0's temp dir goes after the run
}

// A checkpoint under partial rollouts waits only for the steps the weights it holds can make:
// 5-token completions in slices of 2 take 3 batches, so at max staleness 2 new groups start 0
// steps ahead, and the groups of the next step need the next weights; the save must not wait
// for them (it would stop at the timeout).
TEST(MpiGrpo, PartialRolloutsCheckpointWithoutNewWeights) {
  rltest::Fixture f;
  RlOptions o = rltest::small_options();
  o.partial_tokens = 2;
  MpiRlOptions m = mpi_options(3, 2, DType::BF16);
  m.learner_timeout = 5;
  MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, o, m);
  if (!g.is_learner()) {
    g.run_rollout();
    return;
  }
  g.step();
  const double t0 = now_seconds();
  std::vector<BufferedStep> buf;
  EXPECT_NO_THROW(buf = g.buffer_contents());
  EXPECT_LT(now_seconds() - t0, 4.0);
  EXPECT_TRUE(buf.empty()) << "lead 0: no step is generated ahead of the weights";
  g.step();
  g.step();
  g.finish();
}

// Its own CTest entry (rl_mpi_stall): rollout rank 1 stops answering at step 1; the learner must
// stop with an error naming rank 1 within its 2 s timeout. The job then ends through
// abort_job, as `loom rl` ends it; the test passes on the line printed after the checks.
TEST(MpiGrpoFault, StalledRolloutRankStopsTheLearnerWithinTheTimeout) {
  rltest::Fixture f;
  MpiRlOptions m = mpi_options(4, 1, DType::BF16);
  m.learner_timeout = 2;
  m.before_rollout = [](int64_t s) {
    if (W().rank() == 1 && s == 1) sleep_s(60);
  };
  MpiGrpo g(W(), f.model, f.tok, f.chat, f.env, rltest::small_options(), m);
  if (!g.is_learner()) {
    try {
      g.run_rollout();
    } catch (const Error&) {  // the other rollout ranks time out waiting for weights
      sleep_s(30);
    }
    return;
  }
  const double t0 = now_seconds();
  std::string error;
  try {
    for (int64_t s = 0; s < 4; ++s) g.step();
  } catch (const Error& e) {
    error = e.what();
  }
  const double took = now_seconds() - t0;
  EXPECT_NE(error.find("no message from rollout rank(s) 1 (nothing)"), std::string::npos) << error;
  EXPECT_NE(error.find("learner step 1"), std::string::npos) << error;
  EXPECT_LT(took, 2 + 4.0) << "the learner stopped " << took << " s after it started waiting";
  if (!testing::Test::HasFailure())
    std::printf("RL-STALL-TEST-PASSED after %.1f s: %s\n", took, error.c_str());
  std::fflush(stdout);
  comm::abort_job("the stall test ends the job: " + error);
}

LOOM_MPI_TEST_MAIN()
