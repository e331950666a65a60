// Reliability model against Daly's worked examples, Young, the Llama 3 report and the seed.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "plan/cluster.h"
#include "plan/reliability.h"

using namespace loom::plan;

TEST(PlanReliability, DalyWorkedExamples) {
  // Daly 2006, Figs. 3-5: delta = 5 min; M = 24 h -> 117 min, 6 h -> 57 min, 15 min -> 9.1 min.
  EXPECT_NEAR(daly_interval(5, 24 * 60), 117, 0.5);
  EXPECT_NEAR(daly_interval(5, 6 * 60), 57, 0.5);
  EXPECT_NEAR(daly_interval(5, 15), 9.1, 0.05);
  // Beyond delta >= 2M the estimate is M.
  EXPECT_DOUBLE_EQ(daly_interval(40, 15), 15);
}

TEST(PlanReliability, YoungIsFirstOrderDaly) {
  EXPECT_DOUBLE_EQ(young_interval(5, 1440), 120);
  // For delta << M the two agree to first order.
  EXPECT_NEAR(daly_interval(0.01, 1e4) / young_interval(0.01, 1e4), 1.0, 1e-3);
}

TEST(PlanReliability, DalyIntervalMinimisesExpectedWallTime) {
  for (double M : {15.0, 360.0, 1440.0}) {
    double d = 5, R = 10, best_tau = 0, best = 1e300;
    for (double tau = 0.5; tau < 10 * M; tau += 0.01) {
      double w = daly_wall_per_work(tau, d, R, M);
      if (w < best) best = w, best_tau = tau;
    }
    EXPECT_NEAR(daly_interval(d, M) / best_tau, 1.0, 0.03) << M;
  }
}

TEST(PlanReliability, Llama3InterruptionRate) {
  // 419 unexpected interruptions in 54 days on 16,384 H100 GPUs with the default per-GPU MTBF.
  ReliabilityInput in;
  in.gpus = 16384;
  in.gpu_mtbf_hours = cluster_preset("dgx-h100").gpu_mtbf_hours;
  Reliability r = reliability(in);
  EXPECT_NEAR(r.interruptions_per_day * 54, 419, 1);
  EXPECT_NEAR(r.cluster_mtbf_hours, 54.0 * 24 / 419, 0.01);  // ~3.1 h
  // With Llama 3's storage (2 TB/s sustained), a 405B checkpoint (weights + Adam, ~5.7 TB)
  // and a 10-minute restart, goodput lands in the report's "more than 90%" range.
  in.checkpoint_bytes = 405e9 * 14;
  in.ckpt_write_gbs = 2000;
  in.restart_minutes = 10;
  Reliability g = reliability(in);
  EXPECT_GT(g.goodput, 0.90);
  EXPECT_LT(g.goodput, 0.97);
  EXPECT_NEAR(g.wasted_gpu_hours_per_day, 16384 * 24 * (1 - g.goodput), 1e-6);
}

TEST(PlanReliability, SeedMtbfScaling) {
  // Seed fact: a 10-year GPU MTBF over 10,000 GPUs is a ~9 hour cluster MTBF.
  ReliabilityInput in;
  in.gpus = 10000;
  in.gpu_mtbf_hours = 10 * 365 * 24;
  EXPECT_NEAR(reliability(in).cluster_mtbf_hours, 8.76, 0.01);
}

TEST(PlanReliability, GoodputFallsWithScaleAndRisesWithFasterStorage) {
  ReliabilityInput in;
  in.checkpoint_bytes = 1e12;
  in.ckpt_write_gbs = 100;
  in.gpus = 1024;
  double small = reliability(in).goodput;
  in.gpus = 16384;
  double big = reliability(in).goodput;
  in.ckpt_write_gbs = 1000;
  double fast = reliability(in).goodput;
  EXPECT_GT(small, big);
  EXPECT_GT(fast, big);
  EXPECT_LT(big, 1.0);
  EXPECT_NEAR(reliability(in).checkpoint_save_s, 1.0, 1e-9);
}

// Loom's own restart time: the calibrated hang timeout (5 x step, within [10, 600] s) times the
// measured detection ratio, plus the measured relaunch and the checkpoint read.
TEST(PlanReliability, LoomRestartFollowsTheSupervisorsCalibratedTimeout) {
  SupervisorMeasured m;
  m.hang_detect_ratio = 1.5;
  m.relaunch_s = 7;
  EXPECT_DOUBLE_EQ(loom_restart_seconds(1, 3, m), 10 * 1.5 + 7 + 3);  // the floor
  EXPECT_DOUBLE_EQ(loom_restart_seconds(20, 0, m), 100 * 1.5 + 7);    // 5 x step
  EXPECT_DOUBLE_EQ(loom_restart_seconds(1000, 0, m), 600 * 1.5 + 7);  // the cap
  EXPECT_THROW(loom_restart_seconds(-1, 0, m), loom::Error);
  // Faster detection and restart raise goodput over the report's 10 minutes.
  ReliabilityInput in;
  in.gpus = 16384;
  in.checkpoint_bytes = 5.7e12;
  in.restart_minutes = 10;
  double ten = reliability(in).goodput;
  in.restart_minutes = loom_restart_seconds(10, 5.7, SupervisorMeasured{}) / 60;
  EXPECT_GT(reliability(in).goodput, ten);
}
