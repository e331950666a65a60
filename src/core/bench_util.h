// What every benchmark prints beside its figures: this machine is shared and noisy, so the
// load average says how much to trust a timing, and the best of several runs is the one least
// disturbed by other processes.
#pragma once

#include <functional>

namespace loom {

// The 1-minute load average, or -1 where the system does not report it.
double load_average();

// Peak resident memory of this process in MiB (getrusage's ru_maxrss).
double peak_rss_mb();

// Best wall time of fn in seconds over at least min_runs runs and min_time seconds, after one
// warm-up run.
double time_best(const std::function<void()>& fn, double min_time, int min_runs = 5);

}  // namespace loom
