// Asynchronous GRPO in one process: max_staleness 0 reproduces the synchronous loop bit for bit;
// the staleness bound holds under a slowed learner and under slowed rollouts (instrumented), and
// stale groups get importance weights; a stuck rollout side stops the learner with a clear error
// within the stated timeout; a batch past its deadline is dropped and counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "kernels/backend.h"
#include "rl/async_grpo.h"
#include "rl/grpo_trainer.h"
#include "rl/rollout.h"
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

// The learner share: the rollout thread's forward and backward of the last sequences of the
// step's batch, added to the learner's gradients of the rest, gives the bits the learner gets when
// it computes the share itself (the synchronous loop with the same split), and the step one pass
// takes up to the order of the gradient sums.
TEST(AsyncGrpo, LearnerShareIsTheSameStepWhoeverComputesIt) {
  set_num_threads(1);
  RlOptions one = rltest::small_options();
  RlOptions split = one;
  split.learner_share = 0.5;
  rltest::Fixture a, b, c;
  GrpoTrainer sync_split(a.model, a.tok, a.chat, a.env, split);
  GrpoTrainer sync_one(c.model, c.tok, c.chat, c.env, one);
  AsyncOptions ao;
  ao.max_staleness = 0;  // the rollout thread waits for new weights while the learner steps
  ao.threads_per_role = 1;
  ao.learner_timeout = 60;
  ao.help_any_time = true;
  // The rollout thread wakes and takes the offer before the learner's own part ends.
  ao.after_offer = [](int64_t) { sleep_s(0.1); };
  AsyncGrpo async(b.model, b.tok, b.chat, b.env, split, ao);
  int trained = 0;
  for (int s = 0; s < 4; ++s) {
    const RlStepStats x = sync_split.step(), y = async.step(), z = sync_one.step();
    EXPECT_EQ(x.reward_mean, y.reward_mean) << "step " << s;
    EXPECT_EQ(x.loss, y.loss) << "step " << s;
    EXPECT_EQ(x.grad_norm, y.grad_norm) << "step " << s;
    EXPECT_EQ(x.helper_seconds, 0) << "the synchronous loop has no helper";
    if (y.train_tokens > 0) {
      EXPECT_GT(y.helper_seconds, 0) << "step " << s << ": the rollout thread took no share";
      ++trained;
    }
    if (s == 0) {  // the same weights: the same step up to the order of the sums
      EXPECT_EQ(x.loss, z.loss);
      EXPECT_NEAR(x.grad_norm, z.grad_norm, 1e-5 * z.grad_norm);
      EXPECT_GT(z.grad_norm, 0);
    }
  }
  EXPECT_GT(trained, 0) << "no step had a gradient: the comparison proves nothing";
  const ParamSet &pa = a.model.params(), &pb = b.model.params();
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), size_t(pa.total()) * sizeof(float)), 0)
      << "the helper's share gave other weights than the learner's own";
}

TEST(AsyncGrpo, LearnerShareOutsideZeroToOneIsRefused) {
  rltest::Fixture a;
  RlOptions o = rltest::small_options();
  for (double bad : {-0.1, 1.0, 2.0}) {
    o.learner_share = bad;
    try {
      GrpoTrainer t(a.model, a.tok, a.chat, a.env, o);
      ADD_FAILURE() << "learner_share " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rl.learner_share"), std::string::npos) << e.what();
    }
  }
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

// Partial rollouts, one batch at a time: a completion cut at the per-batch slice is carried to
// the next batch and continued there from newer weights; each token keeps the version that
// generated it, and a group is as old as its oldest token.
TEST(AsyncGrpo, PartialRolloutsSpanWeightVersions) {
  rltest::Fixture f;
  RlOptions o = rltest::small_options();
  o.max_tokens = 5;
  o.partial_tokens = 2;  // at most 2 tokens per completion per batch: up to 3 batches
  RolloutWorker w(f.model, f.tok, f.chat, f.env, o);
  std::vector<PromptGroup> carry;
  std::vector<PromptGroup> done;
  int64_t first_carried = 0;
  for (int64_t s = 0; s < 6; ++s) {
    if (s > 0) {
      // New weights between batches (as the learner publishes them): the carried completions
      // go on from these.
      for (int64_t i = 0; i < f.model.params().total(); i += 7) f.model.params().data()[i] *= 0.9f;
      w.weights_updated();
    }
    RolloutBatch b = w.generate(s, s, 0, 1, &carry);
    if (s == 0) first_carried = int64_t(carry.size());
    for (const PromptGroup& g : carry) {
      EXPECT_EQ(g.target_step, s + 1) << "a carried group is retargeted to the next step";
      for (const Rollout& r : g.rollouts) {
        EXPECT_LE(r.response.size(), size_t(2 * (s + 1)));
        EXPECT_EQ(r.versions.size(), r.response.size());
      }
    }
    for (PromptGroup& g : b.groups) done.push_back(std::move(g));
  }
  // 5-token completions need at most 3 batches of 2: only the last two batches' groups are open.
  for (const PromptGroup& g : carry)
    EXPECT_GE(g.task_index, uint64_t(4 * o.prompts_per_step)) << "task " << g.task_index;
  EXPECT_GT(first_carried, 0) << "no completion outlived its slice: nothing was tested";
  int spanning = 0;
  for (const PromptGroup& g : done) {
    EXPECT_EQ(int(g.rollouts.size()), o.group_size);
    int64_t oldest = g.target_step;
    for (const Rollout& r : g.rollouts) {
      ASSERT_EQ(r.versions.size(), r.response.size());
      ASSERT_EQ(r.logprobs.size(), r.response.size());
      EXPECT_LE(int(r.response.size()), o.max_tokens + 1);  // + the stop token
      EXPECT_TRUE(std::is_sorted(r.versions.begin(), r.versions.end()));
      // Each batch generated at most 2 of its tokens: version v covers tokens [2k, 2k + 2).
      for (size_t t = 0; t < r.versions.size(); ++t) {
        EXPECT_LE(r.versions[t], g.target_step);
        if (t >= 2 && r.versions[t] == r.versions[t - 2]) {
          EXPECT_TRUE(r.stopped && t + 1 == r.versions.size())
              << "three tokens of one version in one completion (only a stop token may follow)";
        }
      }
      oldest = std::min(oldest, r.versions.front());
      spanning += r.versions.front() != r.versions.back();
      // Its text is all of its tokens', decoded together.
      std::string text;
      for (size_t t = 0; t + (r.stopped ? 1 : 0) < r.response.size(); ++t)
        if (r.response[t] < f.tok.vocab_size()) f.tok.decode_append(r.response[t], text);
      EXPECT_EQ(r.text, text);
    }
    EXPECT_EQ(g.version, oldest) << "a group is as old as its oldest token";
  }
  EXPECT_GT(spanning, 0) << "no finished completion spans two versions";
}

// Partial rollouts in the asynchronous loop: rollouts continue across learner steps, every
// trained group respects the staleness bound (counted from its oldest token), and the tokens of
// older versions are importance-weighted.
TEST(AsyncGrpo, PartialRolloutsInTheAsyncLoop) {
  rltest::Fixture f;
  RlOptions o = rltest::small_options();
  o.max_tokens = 5;
  o.partial_tokens = 3;  // 2 batches for a 5-token completion
  AsyncOptions ao;
  ao.max_staleness = 2;
  ao.threads_per_role = 1;
  ao.learner_timeout = 60;
  AsyncGrpo t(f.model, f.tok, f.chat, f.env, o, ao);
  int64_t spanning = 0, groups = 0;
  bool weighted = false;
  for (int s = 0; s < 6; ++s) {
    const RlStepStats st = t.step();
    EXPECT_LE(st.staleness.size(), size_t(ao.max_staleness) + 1) << "step " << s;
    spanning += st.spanning_rollouts;
    groups += st.groups;
    weighted |= st.train_tokens > 0 && st.is_weight_mean != 1.0;
  }
  t.stop();
  EXPECT_GT(spanning, 0) << "no trained completion spans two weight versions";
  EXPECT_GT(groups, 0);
  EXPECT_TRUE(weighted) << "tokens of older versions were not importance-weighted";
  EXPECT_EQ(t.buffer_stats().dropped_timeout, 0);
  // New groups start late enough to finish within the bound: none was dropped as stale.
  EXPECT_EQ(t.buffer_stats().dropped_stale, 0);
  // 2 batches per completion need a staleness bound of at least 1 (they continue on newer
  // weights, and a group is as old as its first batch).
  ao.max_staleness = 0;
  rltest::Fixture g;
  EXPECT_THROW(AsyncGrpo(g.model, g.tok, g.chat, g.env, o, ao), Error);
}
