#include <gtest/gtest.h>

#include <cmath>

#include "core/config.h"
#include "core/error.h"
#include "optim/lr_schedule.h"

using namespace loom;

static LrSchedule make(LrSchedule::Kind k) {
  LrSchedule s;
  s.kind = k;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.wsd_decay_fraction = 0.2;
  return s;
}

TEST(LrSchedule, WarmupIsLinearFromZero) {
  LrSchedule s = make(LrSchedule::Kind::Cosine);
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
}

TEST(LrSchedule, CosineLinearConstantShapes) {
  LrSchedule c = make(LrSchedule::Kind::Cosine);
  EXPECT_DOUBLE_EQ(c.at(10), 1.0);
  EXPECT_NEAR(c.at(60), 0.55, 1e-12);  // half way: the mean of max and min
  EXPECT_NEAR(c.at(110), 0.1, 1e-12);
  EXPECT_NEAR(c.at(500), 0.1, 1e-12);  // stays at min after the end
  LrSchedule l = make(LrSchedule::Kind::Linear);
  EXPECT_NEAR(l.at(35), 1.0 - 0.9 * 0.25, 1e-12);
  LrSchedule k = make(LrSchedule::Kind::Constant);
  EXPECT_DOUBLE_EQ(k.at(100), 1.0);
}

TEST(LrSchedule, WsdHoldsThenDecaysOverTheFinalFraction) {
  LrSchedule w = make(LrSchedule::Kind::WSD);
  EXPECT_DOUBLE_EQ(w.at(50), 1.0);
  EXPECT_DOUBLE_EQ(w.at(87), 1.0);  // decay starts at 110 - 22 = 88
  EXPECT_NEAR(w.at(88), 1.0, 1e-12);
  EXPECT_NEAR(w.at(99), 0.1 + 0.9 * (1 - std::sqrt(0.5)), 1e-12);
  EXPECT_NEAR(w.at(110), 0.1, 1e-12);
}

TEST(LrSchedule, ConfigErrors) {
  Config c = Config::parse("[optim]\nschedule = \"exp\"\n", "t");
  EXPECT_THROW(lr_schedule_from(c, 10), Error);
  Config d = Config::parse("[optim]\nlr = 1e-3\nmin_lr = 1e-2\n", "t");
  EXPECT_THROW(lr_schedule_from(d, 10), Error);
}
