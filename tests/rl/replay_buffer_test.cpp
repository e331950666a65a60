// The versioned replay buffer without a model: tags, the staleness bound, drops, the learner's
// bounded wait, a failed producer, and a producer and a learner on two threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "rl/replay_buffer.h"

using namespace loom;
using namespace loom::rl;

namespace {
PromptGroup group(int64_t target, int64_t version, uint64_t index = 0) {
  PromptGroup g;
  g.target_step = target;
  g.version = version;
  g.task_index = index;
  g.rollouts.resize(2);
  return g;
}
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

TEST(ReplayBuffer, HandsOutTheGroupsOfTheStepWithTheirVersions) {
  ReplayBuffer b(1);
  b.push(group(0, 0, 10));
  b.push(group(1, 0, 11));
  b.push(group(1, 1, 12));
  b.push(group(0, 0, 13));
  auto s0 = b.take(0, 2, 1.0);
  ASSERT_EQ(s0.size(), 2u);
  EXPECT_EQ(s0[0].task_index, 10u);
  EXPECT_EQ(s0[1].task_index, 13u);
  auto s1 = b.take(1, 2, 1.0);
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s1[0].version, 0);  // one step stale: allowed with max_staleness 1
  EXPECT_EQ(s1[1].version, 1);
  EXPECT_EQ(b.stats().taken, 4);
  EXPECT_EQ(b.size(), 0);
}

TEST(ReplayBuffer, NeverHandsOutDataOlderThanTheBound) {
  ReplayBuffer b(1);
  b.push(group(3, 1));  // two steps stale for its target: dropped at once
  b.push(group(3, 2));
  EXPECT_EQ(b.stats().dropped_stale, 1);
  auto s = b.take(3, 2, 1.0);  // the dropped one is not waited for
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].version, 2);
  // Left-overs of an earlier step are stale once the learner is past it.
  b.push(group(4, 4));
  b.push(group(5, 5));
  EXPECT_EQ(b.take(5, 1, 1.0).size(), 1u);
  EXPECT_EQ(b.stats().dropped_stale, 2);
  EXPECT_EQ(b.size(), 0);
  // Weights newer than the step they are for cannot exist: a bug, refused.
  EXPECT_THROW(b.push(group(6, 7)), Error);
  ReplayBuffer on_policy(0);
  on_policy.push(group(2, 1));
  EXPECT_EQ(on_policy.stats().dropped_stale, 1);
  EXPECT_THROW(ReplayBuffer(-1), Error);
}

TEST(ReplayBuffer, WaitsWithATimeoutAndAClearError) {
  ReplayBuffer b(1);
  b.push(group(0, 0));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    b.take(0, 3, 0.2);
    FAIL() << "take returned without the groups";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("learner step 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("only 1 arrived"), std::string::npos) << e.what();
  }
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.19);
  EXPECT_LT(waited, 5.0);
}

TEST(ReplayBuffer, DroppedGroupsAreCountedAndNotWaitedFor) {
  ReplayBuffer b(1);
  b.push(group(0, 0));
  b.drop(0, 2, /*timeout=*/true);
  b.drop(0, 1, /*timeout=*/false);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(b.take(0, 4, 10.0).size(), 1u);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(b.stats().dropped_timeout, 2);
  EXPECT_EQ(b.stats().dropped_env, 1);
}

TEST(ReplayBuffer, AFailedProducerWakesTheLearner) {
  ReplayBuffer b(1);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b.fail("rollout thread: out of memory");
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    b.take(0, 1, 30.0);
    ADD_FAILURE() << "take returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 10.0);
  t.join();
  EXPECT_THROW(b.take(1, 1, 0.0), Error);
}

TEST(ReplayBuffer, AProducerAndALearnerOnTwoThreads) {
  // The producer makes the groups of step s from the newest version the learner has published,
  // never running more than max_staleness ahead; the learner checks every group it gets.
  const int64_t S = 1, steps = 30, per_step = 4;
  ReplayBuffer b(S);
  std::atomic<int64_t> version{0};
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    for (int64_t s = 0; s < steps && !stop; ++s) {
      while (s - version.load() > S && !stop)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      const int64_t v = version.load();
      for (int64_t i = 0; i < per_step; ++i) {
        if (i == 3 && s % 5 == 0) {
          b.drop(s, 1, true);
          continue;
        }
        b.push(group(s, v, uint64_t(s * per_step + i)));
        if ((s + i) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  });
  int64_t taken = 0, stale_seen = 0;
  for (int64_t s = 0; s < steps; ++s) {
    auto g = b.take(s, per_step, 20.0);
    EXPECT_EQ(int64_t(g.size()), s % 5 == 0 ? per_step - 1 : per_step) << "step " << s;
    for (auto& x : g) {
      EXPECT_EQ(x.target_step, s);
      EXPECT_LE(s - x.version, S);
      stale_seen += x.version < s;
    }
    taken += int64_t(g.size());
    if (s % 2) std::this_thread::sleep_for(std::chrono::microseconds(300));  // a slow learner
    version = s + 1;
  }
  stop = true;
  producer.join();
  EXPECT_EQ(taken, steps * per_step - steps / 5);
  EXPECT_EQ(b.stats().dropped_timeout, steps / 5);
  EXPECT_EQ(b.stats().dropped_stale, 0);
  EXPECT_GT(stale_seen, 0);  // the producer did run ahead: the bound was exercised
}

// A batch pushed whole (push_step) completes its step: the learner takes the groups that
// finished for it at once, fewer than the step's prompts (partial rollouts carried the rest),
// and groups past the bound in it are dropped and counted; contents() and restore() keep the
// mark, so a checkpoint's partial step is not waited for after a resume.
TEST(ReplayBuffer, APushedStepIsCompleteWithFewerGroups) {
  ReplayBuffer b(1);
  std::vector<PromptGroup> batch = {group(3, 3, 30), group(3, 1, 31), group(3, 2, 32)};
  b.push_step(3, batch, 1, 0);
  EXPECT_EQ(b.stats().dropped_stale, 1);  // version 1 at step 3
  EXPECT_EQ(b.stats().dropped_timeout, 1);
  const auto t0 = std::chrono::steady_clock::now();
  auto got = b.take(3, 8, 5.0);  // 8 prompts a step; 2 arrived, the step is complete
  EXPECT_LT(seconds_since(t0), 1.0) << "the learner waited for groups that will not come";
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].task_index, 30u);
  EXPECT_EQ(got[1].task_index, 32u);
  b.push_step(4, {group(4, 4, 40)}, 0, 0);
  const std::vector<BufferedStep> saved = b.contents();
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_TRUE(saved[0].complete);
  ReplayBuffer r(1);
  r.restore(saved, 4);
  EXPECT_EQ(r.take(4, 8, 0.0).size(), 1u);  // no wait: the step was complete when saved
  // Without the mark the learner waits for the step's count, and says so after its timeout.
  ReplayBuffer w(1);
  w.push(group(5, 5));
  EXPECT_THROW(w.take(5, 8, 0.05), Error);
}
