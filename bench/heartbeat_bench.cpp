// The trainer's cost of being supervised: the heartbeat calls of one step (three section begins
// and a step end, as trainer.cpp makes them) timed over many steps against a live supervisor.
// Run under one: `loom supervise -- build/bench/bench_heartbeat [STEPS]`; without one it times
// the disabled path (one load and a branch per call).
#include <cstdio>
#include <cstdlib>

#include "core/log.h"
#include "resil/heartbeat.h"

int main(int argc, char** argv) {
  using namespace loom::resil;
  long steps = argc > 1 ? std::atol(argv[1]) : 20000;
  bool supervised = std::getenv("LOOM_SUPERVISOR") != nullptr;
  heartbeat_start(0, 1, "");
  double t0 = loom::now_seconds(), c0 = loom::process_cpu_seconds();
  for (long s = 1; s <= steps; ++s) {
    heartbeat_section(Section::Data, s);
    heartbeat_section(Section::ForwardBackward, s);
    heartbeat_section(Section::Optimizer, s);
    heartbeat_step_done(s);
  }
  double wall = loom::now_seconds() - t0, cpu = loom::process_cpu_seconds() - c0;
  double l1 = 0, l5 = 0, l15 = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &l1, &l5, &l15) != 3) l1 = -1;
    std::fclose(f);
  }
  std::printf(
      "heartbeats %s: %.2f us wall, %.2f us cpu per step (4 messages), %ld steps "
      "(load %.2f %.2f %.2f)\n",
      supervised ? "on (supervised)" : "off", wall / steps * 1e6, cpu / steps * 1e6, steps, l1, l5,
      l15);
  return 0;
}
