// The loss guard alone (no model): the moving-window spike test, runs of skipped steps, the
// warn/stop/rollback window rules, the config keys' bad values and the test hook.
#include "train/loss_guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "core/error.h"

using namespace loom;

namespace {

LossGuardOptions opts(SpikeAction a, int window = 5, double threshold = 6, int bad = 3) {
  LossGuardOptions o;
  o.on_spike = a;
  o.window = window;
  o.threshold = threshold;
  o.max_bad_steps = bad;
  return o;
}

// Losses 4.0, 4.1, 4.0, 4.1, ... for n steps (a noisy plateau).
void feed_plateau(LossGuard& g, int n) {
  for (int s = 1; s <= n; ++s)
    ASSERT_EQ(g.observe(s, s % 2 ? 4.1 : 4.0, false).verdict, LossGuard::Verdict::Ok) << s;
}

std::string message_of(const Config& c) {
  try {
    loss_guard_options_from(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LossGuard, SpikeOverTheWindowIsNamedWithStepAndLoss) {
  LossGuard g(opts(SpikeAction::Rollback));
  feed_plateau(g, 5);
  // mean 4.06, sigma max(0.055, 0.02 x 4.06 = 0.081): limit 4.55
  EXPECT_EQ(g.observe(6, 4.5, false).verdict, LossGuard::Verdict::Ok);
  auto r = g.observe(7, 9.0, false);
  EXPECT_EQ(r.verdict, LossGuard::Verdict::Spike);
  EXPECT_NE(r.message.find("step 7: loss 9 spiked"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("last 5 steps"), std::string::npos) << r.message;
}

TEST(LossGuard, NotJudgedBeforeTheWindowIsFull) {
  LossGuard g(opts(SpikeAction::Stop, 5));
  for (int s = 1; s <= 4; ++s)
    EXPECT_EQ(g.observe(s, s == 3 ? 50.0 : 4.0, false).verdict, LossGuard::Verdict::Ok);
  EXPECT_EQ(g.size(), 4u);
}

TEST(LossGuard, FallingLossAndSmallNoiseAreNoSpike) {
  LossGuard g(opts(SpikeAction::Stop, 4, 6));
  double loss = 10;
  for (int s = 1; s <= 200; ++s) {
    loss = loss * 0.97 + (s % 3 == 0 ? 0.05 : 0.0);  // a falling loss with small bumps
    ASSERT_EQ(g.observe(s, loss, false).verdict, LossGuard::Verdict::Ok) << s;
  }
  // A flat window: the sigma floor (2% of the mean) keeps a 5% rise from being a spike.
  LossGuard flat(opts(SpikeAction::Stop, 4, 6));
  for (int s = 1; s <= 4; ++s) flat.observe(s, 3.0, false);
  EXPECT_DOUBLE_EQ(flat.stddev(), 0.0);
  EXPECT_DOUBLE_EQ(flat.sigma(), 0.06);
  EXPECT_EQ(flat.observe(5, 3.15, false).verdict, LossGuard::Verdict::Ok);
  EXPECT_EQ(flat.observe(6, 3.5, false).verdict, LossGuard::Verdict::Spike);
}

TEST(LossGuard, ConsecutiveSkippedStepsDivergeAndAGoodStepResetsTheCount) {
  LossGuard g(opts(SpikeAction::Warn, 5, 6, 3));
  EXPECT_EQ(g.observe(1, NAN, true).verdict, LossGuard::Verdict::Ok);
  EXPECT_EQ(g.observe(2, NAN, true).verdict, LossGuard::Verdict::Ok);
  EXPECT_EQ(g.observe(3, 4.0, false).verdict, LossGuard::Verdict::Ok);  // resets
  EXPECT_EQ(g.observe(4, NAN, true).verdict, LossGuard::Verdict::Ok);
  EXPECT_EQ(g.observe(5, NAN, true).verdict, LossGuard::Verdict::Ok);
  auto r = g.observe(6, NAN, true);
  EXPECT_EQ(r.verdict, LossGuard::Verdict::Diverged);
  EXPECT_NE(r.message.find("step 6: 3 consecutive steps skipped"), std::string::npos) << r.message;
  EXPECT_EQ(g.size(), 1u);  // skipped steps' losses never enter the window
  g.rolled_back();
  EXPECT_EQ(g.observe(7, NAN, true).verdict, LossGuard::Verdict::Ok);  // the count started over
  LossGuard off(opts(SpikeAction::Stop, 5, 6, 0));
  for (int s = 1; s <= 50; ++s)
    EXPECT_EQ(off.observe(s, NAN, true).verdict, LossGuard::Verdict::Ok);
}

TEST(LossGuard, NonFiniteLossOfAnUnskippedStepIsASpike) {
  LossGuard g(opts(SpikeAction::Stop));
  auto r = g.observe(1, INFINITY, false);
  EXPECT_EQ(r.verdict, LossGuard::Verdict::Spike);
  EXPECT_NE(r.message.find("step 1: loss inf is not finite"), std::string::npos) << r.message;
}

// Warned spikes become the window's new normal; stopped or rolled-back ones never enter it.
TEST(LossGuard, OnlyWarnedSpikesEnterTheWindow) {
  LossGuard warn(opts(SpikeAction::Warn, 3)), roll(opts(SpikeAction::Rollback, 3));
  for (LossGuard* g : {&warn, &roll}) {
    for (int s = 1; s <= 3; ++s) g->observe(s, 2.0, false);
    EXPECT_EQ(g->observe(4, 8.0, false).verdict, LossGuard::Verdict::Spike);
  }
  EXPECT_GT(warn.mean(), 2.0);
  EXPECT_DOUBLE_EQ(roll.mean(), 2.0);
  // After three warned steps at the new level the window holds only it: no longer a spike.
  warn.observe(5, 8.0, false);
  warn.observe(6, 8.0, false);
  EXPECT_EQ(warn.observe(7, 8.0, false).verdict, LossGuard::Verdict::Ok);
  EXPECT_EQ(roll.observe(5, 8.0, false).verdict, LossGuard::Verdict::Spike);
}

TEST(LossGuard, ConfigKeysAndTheirBadValues) {
  LossGuardOptions o = loss_guard_options_from(
      Config::parse("[train]\non_spike = \"rollback\"\nspike_window = 7\nspike_threshold = 3.5\n"
                    "max_bad_steps = 4\nmax_rollbacks = 2\n",
                    "t.toml"));
  EXPECT_EQ(o.on_spike, SpikeAction::Rollback);
  EXPECT_EQ(o.window, 7);
  EXPECT_DOUBLE_EQ(o.threshold, 3.5);
  EXPECT_EQ(o.max_bad_steps, 4);
  EXPECT_EQ(o.max_rollbacks, 2);
  EXPECT_EQ(loss_guard_options_from(Config::parse("", "t.toml")).on_spike, SpikeAction::Warn);
  auto bad = [](const std::string& kv) { return message_of(Config::parse("[train]\n" + kv, "t")); };
  EXPECT_NE(bad("on_spike = \"retry\"")
                .find("train.on_spike must be warn, stop or rollback, got "
                      "'retry'"),
            std::string::npos);
  EXPECT_NE(bad("spike_window = 1").find("train.spike_window = 1 must lie in [2, 100000]"),
            std::string::npos);
  EXPECT_NE(bad("spike_threshold = 0").find("train.spike_threshold = 0 must be a positive"),
            std::string::npos);
  EXPECT_NE(bad("spike_threshold = -2").find("train.spike_threshold = -2"), std::string::npos);
  EXPECT_NE(bad("max_rollbacks = -1").find("train.max_rollbacks = -1 must lie in [0, 1000]"),
            std::string::npos);
  EXPECT_NE(bad("max_bad_steps = -3").find("train.max_bad_steps = -3 must be >= 0"),
            std::string::npos);
}

TEST(LossGuard, TestHookScalesOneStepOncePerGuard) {
  LossGuard g(opts(SpikeAction::Stop));
  ::setenv("LOOM_TEST_LOSS_SPIKE", "4:10", 1);
  EXPECT_DOUBLE_EQ(g.apply_test_spike(3, 2.0), 2.0);
  EXPECT_DOUBLE_EQ(g.apply_test_spike(4, 2.0), 20.0);
  EXPECT_DOUBLE_EQ(g.apply_test_spike(4, 2.0), 2.0);  // a rolled-back run passes it again
  LossGuard other(opts(SpikeAction::Stop));
  EXPECT_DOUBLE_EQ(other.apply_test_spike(4, 2.0), 20.0);
  ::unsetenv("LOOM_TEST_LOSS_SPIKE");
  LossGuard unset(opts(SpikeAction::Stop));
  EXPECT_DOUBLE_EQ(unset.apply_test_spike(4, 2.0), 2.0);
}
