#include "resil/timeouts.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::resil {

void TimeoutPolicy::validate() const {
  auto finite = [](double v) { return std::isfinite(v); };
  LOOM_CHECK(finite(fixed) && fixed >= 0, "--hang-timeout must be >= 0 seconds, got ", fixed);
  LOOM_CHECK(finite(multiplier) && multiplier >= 1, "--timeout-multiplier must be >= 1, got ",
             multiplier);
  LOOM_CHECK(finite(floor) && floor > 0, "--timeout-floor must be > 0 seconds, got ", floor);
  LOOM_CHECK(finite(cap) && cap >= floor, "--timeout-cap (", cap,
             ") must be a number >= --timeout-floor (", floor, ")");
  LOOM_CHECK(finite(startup) && startup > 0, "--startup-timeout must be > 0 seconds, got ",
             startup);
}

void PhaseTimeouts::observe(const std::string& phase, double seconds) {
  if (phase == "init" || !(seconds >= 0)) return;  // start-up always gets the start-up timeout
  double& m = longest_[phase];
  m = std::max(m, seconds);
}

double PhaseTimeouts::longest(const std::string& phase) const {
  auto it = longest_.find(phase);
  return it == longest_.end() ? 0 : it->second;
}

double PhaseTimeouts::timeout(const std::string& phase) const {
  auto it = longest_.find(phase);
  if (phase == "init" || it == longest_.end()) return std::max(policy_.startup, policy_.fixed);
  if (policy_.fixed > 0) return policy_.fixed;
  return std::clamp(policy_.multiplier * it->second, policy_.floor, policy_.cap);
}

}  // namespace loom::resil
