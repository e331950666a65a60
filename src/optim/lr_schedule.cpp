#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/config.h"
#include "core/error.h"

namespace loom {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / warmup_steps;
  if (kind == Kind::Constant) return max_lr;
  const double span = std::max<int64_t>(1, total_steps - warmup_steps);
  const double t = std::min(1.0, (step - warmup_steps) / span);  // progress after warmup
  switch (kind) {
    case Kind::Cosine:
      return min_lr + 0.5 * (max_lr - min_lr) * (1 + std::cos(M_PI * t));
    case Kind::Linear:
      return max_lr + (min_lr - max_lr) * t;
    case Kind::WSD: {
      const int64_t decay_steps = static_cast<int64_t>(wsd_decay_fraction * total_steps);
      const int64_t decay_start = total_steps - decay_steps;
      if (step < decay_start || decay_steps <= 0) return max_lr;
      double d = std::min(1.0, static_cast<double>(step - decay_start) / decay_steps);
      return min_lr + (max_lr - min_lr) * (1 - std::sqrt(d));  // "1-sqrt" cooldown
    }
    case Kind::Constant:
      break;
  }
  return max_lr;
}

void LrSchedule::validate() const {
  LOOM_CHECK(max_lr > 0, "optim.lr must be positive, got ", max_lr);
  LOOM_CHECK(min_lr >= 0 && min_lr <= max_lr, "optim.min_lr must lie in [0, optim.lr], got ",
             min_lr);
  LOOM_CHECK(warmup_steps >= 0, "optim.warmup_steps must be >= 0");
  LOOM_CHECK(wsd_decay_fraction >= 0 && wsd_decay_fraction <= 1,
             "optim.wsd_decay_fraction must lie in [0, 1]");
}

LrSchedule lr_schedule_from(const Config& cfg, int64_t total_steps) {
  LrSchedule s;
  std::string kind = cfg.get_string("optim.schedule", "cosine");
  if (kind == "cosine")
    s.kind = LrSchedule::Kind::Cosine;
  else if (kind == "linear")
    s.kind = LrSchedule::Kind::Linear;
  else if (kind == "constant")
    s.kind = LrSchedule::Kind::Constant;
  else if (kind == "wsd")
    s.kind = LrSchedule::Kind::WSD;
  else
    fail("optim.schedule must be cosine, linear, constant or wsd, got '", kind, "'");
  s.max_lr = cfg.get_double("optim.lr", s.max_lr);
  s.min_lr = cfg.get_double("optim.min_lr", s.max_lr * 0.1);
  s.warmup_steps = cfg.get_int("optim.warmup_steps", 0);
  s.wsd_decay_fraction = cfg.get_double("optim.wsd_decay_fraction", s.wsd_decay_fraction);
  s.total_steps = total_steps;
  s.validate();
  return s;
}

}  // namespace loom
