#include "resil/straggler.h"

#include <gtest/gtest.h>

namespace loom::resil {
namespace {

// One synchronous step as the supervisor sees it: every rank begins "data" at t0; rank `slow`
// spends `extra` seconds more there; forward_backward ends in a collective, so every rank
// leaves it together; then a short local optimizer step.
std::vector<StragglerReport> step(StragglerDetector& d, int world, int64_t s, int slow,
                                  double extra) {
  double t0 = double(s);
  double fb_begin_last = t0 + 0.01 + extra;
  std::vector<StragglerReport> out;
  for (int r = 0; r < world; ++r) {
    d.on_section(r, s, "data", t0);
    d.on_section(r, s, "forward_backward", t0 + 0.01 + (r == slow ? extra : 0));
    d.on_section(r, s, "optimizer", fb_begin_last + 0.05);
  }
  for (int r = 0; r < world; ++r) {
    auto rep = d.on_step_end(r, s, fb_begin_last + 0.06);
    out.insert(out.end(), rep.begin(), rep.end());
  }
  return out;
}

TEST(Stragglers, TheSlowRankIsNamedNotTheOnesWaitingForIt) {
  for (int world : {2, 3, 8}) {
    StragglerOptions o;
    o.patience = 3;
    StragglerDetector d(world, o);
    for (int64_t s = 1; s <= 2; ++s) EXPECT_TRUE(step(d, world, s, 1, 0.3).empty()) << s;
    auto rep = step(d, world, 3, 1, 0.3);
    ASSERT_EQ(rep.size(), 1u) << "world " << world;
    EXPECT_EQ(rep[0].kind, StragglerReport::Flagged);
    EXPECT_EQ(rep[0].rank, 1);
    EXPECT_EQ(rep[0].step, 3);
    EXPECT_EQ(rep[0].section, "data");
    EXPECT_LT(rep[0].score, 0.75);
    EXPECT_NEAR(rep[0].seconds, 0.37, 1e-9);  // 0.31 data + 0.05 forward_backward + 0.01
    // The waiting ranks spent 0.35 s in forward_backward, but only 0.05 s of it after the
    // last rank arrived: their scores stay >= 1.
    for (int r = 0; r < world; ++r) {
      if (r == 1) continue;
      EXPECT_GE(d.last_scores()[size_t(r)], 1.0) << "rank " << r;
    }
    rep = step(d, world, 4, 1, 0.3);
    ASSERT_EQ(rep.size(), 1u);
    EXPECT_EQ(rep[0].kind, StragglerReport::Slow);  // still slow, named once in the log
    rep = step(d, world, 5, -1, 0);
    ASSERT_EQ(rep.size(), 1u);
    EXPECT_EQ(rep[0].kind, StragglerReport::Recovered);
    EXPECT_EQ(rep[0].rank, 1);
    EXPECT_TRUE(step(d, world, 6, -1, 0).empty());
  }
}

TEST(Stragglers, ABriefSlowdownOrNoiseIsNotFlagged) {
  StragglerOptions o;
  o.patience = 3;
  StragglerDetector d(4, o);
  // Slow for two steps, then fine: the run of low scores restarts.
  EXPECT_TRUE(step(d, 4, 1, 2, 0.3).empty());
  EXPECT_TRUE(step(d, 4, 2, 2, 0.3).empty());
  EXPECT_TRUE(step(d, 4, 3, -1, 0).empty());
  EXPECT_TRUE(step(d, 4, 4, 2, 0.3).empty());
  EXPECT_TRUE(step(d, 4, 5, 2, 0.3).empty());
  // A score far below the threshold, but 5 ms over the median: scheduling noise, not a rank.
  StragglerDetector tiny(2, o);
  for (int64_t s = 1; s <= 6; ++s) {
    double t0 = double(s);
    for (int r = 0; r < 2; ++r) tiny.on_section(r, s, "data", t0);
    EXPECT_TRUE(tiny.on_step_end(0, s, t0 + 0.001).empty());
    EXPECT_TRUE(tiny.on_step_end(1, s, t0 + 0.006).empty());
  }
  EXPECT_LT(tiny.last_scores()[1], 0.75);
}

TEST(Stragglers, ARestartForgetsUnfinishedSteps) {
  StragglerOptions o;
  o.patience = 2;
  StragglerDetector d(2, o);
  EXPECT_TRUE(step(d, 2, 1, 0, 0.3).empty());
  d.on_section(0, 2, "data", 2.0);  // rank 1 died before step 2
  d.reset();
  EXPECT_TRUE(step(d, 2, 2, 0, 0.3).empty()) << "the slow run restarts with the attempt";
  ASSERT_EQ(step(d, 2, 3, 0, 0.3).size(), 1u);
}

}  // namespace
}  // namespace loom::resil
