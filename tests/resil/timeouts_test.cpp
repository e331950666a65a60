#include "resil/timeouts.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace loom::resil {
namespace {

TEST(PhaseTimeouts, CalibratesFromTheLongestObservedPhase) {
  TimeoutPolicy p;
  p.multiplier = 4;
  p.floor = 2;
  p.cap = 30;
  p.startup = 100;
  PhaseTimeouts t(p);
  EXPECT_EQ(t.timeout("forward_backward"), 100);  // never seen to end: start-up timeout
  t.observe("forward_backward", 0.1);
  EXPECT_EQ(t.timeout("forward_backward"), 2);  // 0.4 s, raised to the floor
  t.observe("forward_backward", 1.5);
  t.observe("forward_backward", 0.2);  // shorter ones do not lower it
  EXPECT_DOUBLE_EQ(t.timeout("forward_backward"), 6);
  t.observe("checkpoint", 20);
  EXPECT_EQ(t.timeout("checkpoint"), 30);  // 80 s, held to the cap
  EXPECT_EQ(t.timeout("data"), 100);       // phases are calibrated apart
  t.observe("init", 1);                    // start-up is never calibrated
  EXPECT_EQ(t.timeout("init"), 100);
}

TEST(PhaseTimeouts, FixedTimeoutOverridesCalibration) {
  TimeoutPolicy p;
  p.fixed = 7;
  p.startup = 50;
  PhaseTimeouts t(p);
  t.observe("data", 100);
  EXPECT_EQ(t.timeout("data"), 7);
  EXPECT_EQ(t.timeout("init"), 50);
}

TEST(PhaseTimeouts, ImpossiblePoliciesAreRefusedNamingTheFlag) {
  auto error_of = [](TimeoutPolicy p) -> std::string {
    try {
      p.validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TimeoutPolicy p;
  EXPECT_EQ(error_of(p), "");
  p.cap = 5;  // below the floor of 10
  EXPECT_NE(error_of(p).find("--timeout-cap"), std::string::npos);
  p = TimeoutPolicy{};
  p.multiplier = 0.5;
  EXPECT_NE(error_of(p).find("--timeout-multiplier"), std::string::npos);
  p = TimeoutPolicy{};
  p.startup = 0;
  EXPECT_NE(error_of(p).find("--startup-timeout"), std::string::npos);
}

}  // namespace
}  // namespace loom::resil
