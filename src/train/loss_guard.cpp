#include "train/loss_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/log.h"

namespace loom {

LossGuardOptions loss_guard_options_from(const Config& c) {
  LossGuardOptions o;
  const std::string action = c.get_string("train.on_spike", spike_action_name(o.on_spike));
  if (action == "warn")
    o.on_spike = SpikeAction::Warn;
  else if (action == "stop")
    o.on_spike = SpikeAction::Stop;
  else if (action == "rollback")
    o.on_spike = SpikeAction::Rollback;
  else
    fail("train.on_spike must be warn, stop or rollback, got '", action, "'");
  const int64_t window = c.get_int("train.spike_window", o.window);
  LOOM_CHECK(window >= 2 && window <= 100000, "train.spike_window = ", window,
             " must lie in [2, 100000] steps");
  o.window = static_cast<int>(window);
  o.threshold = c.get_double("train.spike_threshold", o.threshold);
  LOOM_CHECK(std::isfinite(o.threshold) && o.threshold > 0, "train.spike_threshold = ", o.threshold,
             " must be a positive number (standard deviations above the mean)");
  const int64_t bad = c.get_int("train.max_bad_steps", o.max_bad_steps);
  LOOM_CHECK(bad >= 0 && bad <= 1000000, "train.max_bad_steps = ", bad, " must be >= 0");
  o.max_bad_steps = static_cast<int>(bad);
  const int64_t rollbacks = c.get_int("train.max_rollbacks", o.max_rollbacks);
  LOOM_CHECK(rollbacks >= 0 && rollbacks <= 1000, "train.max_rollbacks = ", rollbacks,
             " must lie in [0, 1000]");
  o.max_rollbacks = static_cast<int>(rollbacks);
  return o;
}

const char* spike_action_name(SpikeAction a) {
  switch (a) {
    case SpikeAction::Warn:
      return "warn";
    case SpikeAction::Stop:
      return "stop";
    case SpikeAction::Rollback:
      return "rollback";
  }
  return "?";
}

double LossGuard::mean() const {
  if (window_.empty()) return 0;
  double s = 0;
  for (double v : window_) s += v;
  return s / double(window_.size());
}

double LossGuard::stddev() const {
  if (window_.size() < 2) return 0;
  const double m = mean();
  double s = 0;
  for (double v : window_) s += (v - m) * (v - m);
  return std::sqrt(s / double(window_.size() - 1));
}

double LossGuard::sigma() const {
  return std::max(stddev(), kMinRelativeSigma * std::fabs(mean()));
}

LossGuard::Result LossGuard::observe(int64_t step, double loss, bool skipped) {
  Result r;
  if (skipped || !std::isfinite(loss)) {
    // Skipped steps leave the weights as they were; only a run of them says the weights (or
    // the data) are broken for good. A non-finite loss of a step that was not skipped
    // (finite gradients) is a spike at once.
    if (!skipped) {
      r.verdict = Verdict::Spike;
      r.message = cat("step ", step, ": loss ", loss, " is not finite");
      return r;
    }
    ++bad_steps_;
    if (opt_.max_bad_steps > 0 && bad_steps_ >= opt_.max_bad_steps) {
      r.verdict = Verdict::Diverged;
      r.message =
          cat("step ", step, ": ", bad_steps_,
              " consecutive steps skipped for non-finite gradients (loss ", loss,
              "): the run has diverged or its weights are not finite (train.max_bad_steps)");
    }
    return r;
  }
  bad_steps_ = 0;
  // Judged only once the window is full: the first steps' fast fall is no baseline.
  if (window_.size() >= size_t(opt_.window)) {
    const double m = mean(), s = sigma(), limit = m + opt_.threshold * s;
    if (loss > limit) {
      r.verdict = Verdict::Spike;
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "step %lld: loss %.6g spiked above %.6g (mean %.6g + %g x sigma %.4g over the "
                    "last %zu steps)",
                    static_cast<long long>(step), loss, limit, m, opt_.threshold, s,
                    window_.size());
      r.message = buf;
      // A warned spike is the run's new normal (it goes on from these weights); one that is
      // rolled back or stops the run never enters the window.
      if (opt_.on_spike != SpikeAction::Warn) return r;
    }
  }
  window_.push_back(loss);
  while (window_.size() > size_t(opt_.window)) window_.pop_front();
  return r;
}

double LossGuard::apply_test_spike(int64_t step, double loss) {
  const char* e = std::getenv("LOOM_TEST_LOSS_SPIKE");
  if (!e || test_spike_fired_) return loss;
  long long s = -1;
  double factor = 1;
  if (std::sscanf(e, "%lld:%lf", &s, &factor) != 2 || s != step) return loss;
  test_spike_fired_ = true;
  return loss * factor;
}

}  // namespace loom
