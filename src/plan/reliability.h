// Reliability: cluster MTBF from per-GPU MTBF, checkpoint save time, the optimal checkpoint
// interval (Young 1974: sqrt(2 d M); Daly 2006: higher-order estimate), and expected goodput
// from Daly's wall-clock model with exponential failures.
#pragma once

#include <cstdint>

namespace loom::plan {

// Young's first-order optimum interval between checkpoints (same unit as the inputs).
double young_interval(double save_time, double mtbf);
// Daly's higher-order estimate: sqrt(2dM)[1 + sqrt(d/2M)/3 + (d/2M)/9] - d for d < 2M, else M.
double daly_interval(double save_time, double mtbf);
// Expected wall time per unit of useful work with checkpoint interval tau, save time d,
// restart time R and MTBF M (Daly 2006, eq. 13): (M/tau) e^(R/M) (e^((tau+d)/M) - 1).
double daly_wall_per_work(double tau, double save_time, double restart, double mtbf);

struct ReliabilityInput {
  int64_t gpus = 1;
  double gpu_mtbf_hours = 54.0 * 24 * 16384 / 419;
  double checkpoint_bytes = 0;
  double ckpt_write_gbs = 1000;
  double restart_minutes = 10;
};

struct Reliability {
  double cluster_mtbf_hours = 0;
  double interruptions_per_day = 0;
  double checkpoint_save_s = 0;
  double young_interval_s = 0;
  double daly_interval_s = 0;
  double goodput = 0;  // useful fraction of wall time at Daly's interval
  double wasted_gpu_hours_per_day = 0;
};

Reliability reliability(const ReliabilityInput& in);

}  // namespace loom::plan
