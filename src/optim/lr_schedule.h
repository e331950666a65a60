// Learning-rate schedules: linear warmup from 0, then cosine, linear or constant decay to
// min_lr, or WSD (warmup-stable-decay: hold the peak, then decay over the final fraction).
#pragma once

#include <cstdint>
#include <string>

namespace loom {

class Config;

struct LrSchedule {
  enum class Kind { Cosine, Linear, Constant, WSD };
  Kind kind = Kind::Cosine;
  double max_lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double wsd_decay_fraction = 0.2;  // WSD: fraction of total steps spent decaying (1-sqrt)

  double at(int64_t step) const;  // step counts from 0
  void validate() const;
};

LrSchedule lr_schedule_from(const Config& cfg, int64_t total_steps);

}  // namespace loom
