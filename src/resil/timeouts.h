// How long a rank may stay silent before the supervisor declares it hung. Every heartbeat
// begins a phase named by what the rank said (a section such as "forward_backward", "step"
// after a step's end, "init" after its hello); the timeout of a phase is a multiple of the
// longest that phase has been seen to last, between a floor and a cap (as NVIDIA Resiliency
// Extension's section timeouts). A phase never seen to end, and a rank's start-up, get the
// start-up timeout: a first checkpoint or a first step may take far longer than later ones.
#pragma once

#include <map>
#include <string>

namespace loom::resil {

struct TimeoutPolicy {
  double fixed = 0;       // > 0: this timeout for every phase after start-up (no calibration)
  double multiplier = 5;  // x the longest observed duration of the phase
  double floor = 10;      // seconds
  double cap = 600;       // seconds
  double startup = 300;   // seconds: launch to hello, hello to first heartbeat, unseen phases

  void validate() const;  // throws loom::Error naming the flag
};

class PhaseTimeouts {
 public:
  explicit PhaseTimeouts(TimeoutPolicy p) : policy_(p) {}
  void observe(const std::string& phase, double seconds);
  double timeout(const std::string& phase) const;
  // Longest observed duration of a phase, 0 if never seen.
  double longest(const std::string& phase) const;
  const TimeoutPolicy& policy() const { return policy_; }

 private:
  TimeoutPolicy policy_;
  std::map<std::string, double> longest_;
};

}  // namespace loom::resil
