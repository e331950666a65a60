// The loss guard (train.on_spike): watches each step's loss and skipped flag and says when a run
// has gone wrong, so the trainer can stop or roll back to its last good checkpoint before a
// checkpoint of bad weights is written. After Megatron's rerun state machine (which re-runs the
// suspect step to tell a hardware fault from bad data); here a spike is judged against a moving
// window and the data since the checkpoint is skipped, since a CPU re-run of the same step
// proves nothing new. No model needed: the trainer feeds it numbers (unit-tested alone).
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "core/config.h"

namespace loom {

enum class SpikeAction { Warn, Stop, Rollback };

struct LossGuardOptions {
  SpikeAction on_spike = SpikeAction::Warn;  // train.on_spike: warn, stop or rollback
  int window = 50;         // train.spike_window: finite losses the spike test compares against
  double threshold = 6.0;  // train.spike_threshold: spike when loss > mean + threshold x sigma
  int max_bad_steps = 10;  // train.max_bad_steps: consecutive skipped steps that end it; 0 = off
  int max_rollbacks = 3;   // train.max_rollbacks: then the run stops
};

// Reads train.on_spike, spike_window, spike_threshold, max_bad_steps and max_rollbacks,
// refusing impossible values with the key and the value.
LossGuardOptions loss_guard_options_from(const Config& c);
const char* spike_action_name(SpikeAction a);

class LossGuard {
 public:
  enum class Verdict {
    Ok,
    Spike,     // the loss rose beyond the threshold over the window (or is not finite)
    Diverged,  // max_bad_steps consecutive skipped steps
  };
  struct Result {
    Verdict verdict = Verdict::Ok;
    std::string message;  // names the step, the loss and the window's statistics
  };

  explicit LossGuard(const LossGuardOptions& o) : opt_(o) {}
  // One finished step (numbered as the log numbers it: 1 for the first). A skipped step's loss
  // is not judged (its gradients were not finite; the weights did not move).
  Result observe(int64_t step, double loss, bool skipped);
  // After a rollback: the bad-step run starts over; the window keeps the losses before the
  // spike (the restored weights produced them or their like).
  void rolled_back() { bad_steps_ = 0; }
  // The window's mean and standard deviation, and the sigma the test uses (at least
  // kMinRelativeSigma x |mean|, so a flat window does not make noise a spike).
  double mean() const;
  double stddev() const;
  double sigma() const;
  size_t size() const { return window_.size(); }
  const LossGuardOptions& options() const { return opt_; }
  // Test hook LOOM_TEST_LOSS_SPIKE=<step>:<factor>: the loss of that step (numbered as logged)
  // is multiplied by factor, once per guard (a rolled-back run passes the step again unharmed).
  // Returns the loss to use.
  double apply_test_spike(int64_t step, double loss);

  static constexpr double kMinRelativeSigma = 0.02;

 private:
  LossGuardOptions opt_;
  std::deque<double> window_;
  int bad_steps_ = 0;
  bool test_spike_fired_ = false;
};

}  // namespace loom
