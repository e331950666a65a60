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

// Loom's own restart time, for clusters that give none: the supervisor of `loom launch` /
// `loom supervise` (src/resil, docs/resilience.md), measured by bench/supervisor_bench.sh.
// Every failure is taken to be a hang, the slow case (a crash is seen when the rank's
// connection drops, in 1-3 s): detection is the calibrated timeout (multiplier x the step
// time, within [floor, cap], the supervisor's defaults) times the measured ratio of detection
// to timeout; then the relaunch measured from a kill -9 to the end of the restarted job's first
// step, less its crash detection (so it still holds that run's own small checkpoint read and
// one step: conservative); then reading the checkpoint back at the storage bandwidth (taken
// equal to the write bandwidth). Replacing a failed node is not in it: the restart keeps the
// world size.
struct SupervisorMeasured {
  double timeout_multiplier = 5, timeout_floor_s = 10, timeout_cap_s = 600;
  // Detection / calibrated timeout: 0.98 measured with gpt2-124m, 1.005 with tiny.
  double hang_detect_ratio = 1.01;
  // 46.7 s from kill -9 to the first step again (gpt2-124m), less 3.0 s crash detection.
  double relaunch_s = 43.7;
  const char* source =
      "bench/supervisor_bench.sh, gpt2-124m seq 128, 2 ranks ZeRO-1, 2-core VM at load ~19, "
      "2026-11-26";
};
double loom_restart_seconds(double step_s, double reload_s,
                            const SupervisorMeasured& m = SupervisorMeasured{});

}  // namespace loom::plan
