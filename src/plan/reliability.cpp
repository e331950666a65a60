#include "plan/reliability.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::plan {

double young_interval(double d, double M) {
  return std::sqrt(2 * d * M);
}

double daly_interval(double d, double M) {
  if (d >= 2 * M) return M;
  double x = d / (2 * M);
  return std::sqrt(2 * d * M) * (1 + std::sqrt(x) / 3 + x / 9) - d;
}

double daly_wall_per_work(double tau, double d, double R, double M) {
  return M / tau * std::exp(R / M) * (std::exp((tau + d) / M) - 1);
}

Reliability reliability(const ReliabilityInput& in) {
  LOOM_CHECK(in.gpus >= 1 && in.gpu_mtbf_hours > 0 && in.ckpt_write_gbs > 0,
             "reliability: gpus, gpu_mtbf_hours and ckpt_write_gbs must be positive");
  Reliability r;
  r.cluster_mtbf_hours = in.gpu_mtbf_hours / double(in.gpus);  // independent failures add up
  r.interruptions_per_day = 24 / r.cluster_mtbf_hours;
  r.checkpoint_save_s = in.checkpoint_bytes / (in.ckpt_write_gbs * 1e9);
  double M = r.cluster_mtbf_hours * 3600, d = r.checkpoint_save_s, R = in.restart_minutes * 60;
  r.young_interval_s = young_interval(d, M);
  r.daly_interval_s = daly_interval(d, M);
  double tau = std::max(r.daly_interval_s, 1e-9);
  r.goodput = 1 / daly_wall_per_work(tau, d, R, M);
  r.wasted_gpu_hours_per_day = double(in.gpus) * 24 * (1 - r.goodput);
  return r;
}

double loom_restart_seconds(double step_s, double reload_s, const SupervisorMeasured& m) {
  LOOM_CHECK(step_s >= 0 && reload_s >= 0, "loom_restart_seconds: negative time");
  double timeout = std::clamp(m.timeout_multiplier * step_s, m.timeout_floor_s, m.timeout_cap_s);
  return timeout * m.hang_detect_ratio + m.relaunch_s + reload_s;
}

}  // namespace loom::plan
