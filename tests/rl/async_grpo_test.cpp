// Asynchronous GRPO in one process: max_staleness 0 reproduces the synchronous loop bit for bit;
// the staleness bound holds under a slowed learner and under slowed rollouts (instrumented), and
// stale groups get importance weights; a stuck rollout side stops the learner with a clear error
// within the stated timeout; a batch past its deadline is dropped and counted.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "kernels/backend.h"
#include "rl/async_grpo.h"
#include "rl/grpo_trainer.h"
#include "rl_test_util.h"

using namespace loom;
using namespace loom::rl;

namespace {

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace

TEST(AsyncGrpo, StalenessZeroIsTheSynchronousAlgorithm) {
  set_num_threads(1);  // both runs on one thread per role: the same kernels, the same bits
  const RlOptions o = rltest::small_options();
  rltest::Fixture a, b;
  GrpoTrainer sync(a.model, a.tok, a.chat, a.env, o);
  AsyncOptions ao;
  ao.max_staleness = 0;
  ao.threads_per_role = 1;
  ao.learner_timeout = 60;
  AsyncGrpo async(b.model, b.tok, b.chat, b.env, o, ao);
  int trained = 0;
  for (int s = 0; s < 4; ++s) {
    const RlStepStats x = sync.step(), y = async.step();
    EXPECT_EQ(x.reward_mean, y.reward_mean) << "step " << s;
    EXPECT_EQ(x.loss, y.loss) << "step " << s;
    EXPECT_EQ(x.grad_norm, y.grad_norm) << "step " << s;
    EXPECT_EQ(x.train_tokens, y.train_tokens) << "step " << s;
    ASSERT_EQ(y.staleness.size(), 1u);  // every group from the current weights
    EXPECT_EQ(y.is_weight_mean, 1.0);
    trained += x.train_tokens > 0;
  }
  EXPECT_GT(trained, 0) << "no step had a gradient: the comparison proves nothing";
  const ParamSet &pa = a.model.params(), &pb = b.model.params();
  ASSERT_EQ(pa.total(), pb.total());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), size_t(pa.total()) * sizeof(float)), 0)
      << "the weights differ after 4 steps";
  EXPECT_EQ(async.buffer_stats().dropped_stale, 0);
}

TEST(AsyncGrpo, StalenessBoundHoldsUnderASlowLearner) {
  for (int64_t S : {1, 2}) {
    rltest::Fixture f;
    AsyncOptions ao;
    ao.max_staleness = S;
    ao.threads_per_role = 1;
    ao.learner_timeout = 60;
    ao.before_learn = [](int64_t) { sleep_s(0.15); };  // the rollouts run ahead as far as allowed
    AsyncGrpo t(f.model, f.tok, f.chat, f.env, rltest::small_options(), ao);
    std::vector<int64_t> ages(size_t(S) + 1, 0);
    bool weighted = false;
    for (int s = 0; s < 5; ++s) {
      const RlStepStats st = t.step();
      EXPECT_LE(st.staleness.size(), size_t(S) + 1) << "step " << s << ": data older than " << S;
      EXPECT_EQ(st.groups, 3);
      for (size_t k = 0; k < st.staleness.size(); ++k) ages[k] += st.staleness[k];
      weighted |= st.train_tokens > 0 && st.is_weight_mean != 1.0;
    }
    EXPECT_GT(ages[size_t(S)], 0) << "the rollouts never ran " << S << " steps ahead";
    EXPECT_TRUE(weighted) << "stale samples were not importance-weighted";
  }
}

TEST(AsyncGrpo, StalenessBoundHoldsUnderSlowRollouts) {
  rltest::Fixture f;
  AsyncOptions ao;
  ao.max_staleness = 1;
  ao.threads_per_role = 1;
  ao.learner_timeout = 60;
  ao.before_rollout = [](int64_t) { sleep_s(0.1); };
  AsyncGrpo t(f.model, f.tok, f.chat, f.env, rltest::small_options(), ao);
  double waited = 0;
  for (int s = 0; s < 4; ++s) {
    const RlStepStats st = t.step();
    EXPECT_LE(st.staleness.size(), 2u);
    waited += st.learner_wait_seconds;
  }
  EXPECT_GT(waited, 0.2);  // the learner waited for the slow rollouts instead of reusing data
}

TEST(AsyncGrpo, AStuckRolloutSideStopsTheLearnerWithinTheTimeout) {
  rltest::Fixture f;
  AsyncOptions ao;
  ao.max_staleness = 1;
  ao.threads_per_role = 1;
  ao.learner_timeout = 0.5;
  ao.before_rollout = [](int64_t s) {
    if (s >= 1) sleep_s(2.0);  // hangs (for longer than the learner waits)
  };
  AsyncGrpo t(f.model, f.tok, f.chat, f.env, rltest::small_options(), ao);
  t.step();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    t.step();
    FAIL() << "the learner trained without its data";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("learner step 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.9);
}

TEST(AsyncGrpo, LateGroupsAreDroppedAndCounted) {
  rltest::Fixture f;
  RlOptions o = rltest::small_options();
  o.rollout_timeout = 1e-9;  // past the deadline after the first engine step
  GrpoTrainer t(f.model, f.tok, f.chat, f.env, o);
  const RlStepStats st = t.step();
  EXPECT_EQ(st.dropped_timeout, 3);
  EXPECT_EQ(st.groups, 0);
  EXPECT_EQ(st.train_tokens, 0);
}
