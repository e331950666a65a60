#include "core/bench_util.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>

#include "core/log.h"

namespace loom {

double load_average() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux reports KiB
}

double time_best(const std::function<void()>& fn, double min_time, int min_runs) {
  fn();
  double best = 1e300;
  const double start = now_seconds();
  for (int runs = 0; runs < min_runs || now_seconds() - start < min_time; ++runs) {
    const double t0 = now_seconds();
    fn();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

}  // namespace loom
