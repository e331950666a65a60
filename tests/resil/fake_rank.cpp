// A stand-in for a training rank in the supervisor tests: heartbeats like the trainer's
// (data, forward_backward, optimizer, step end) at ~20 ms a step, with a fault on request.
// fake_rank <rank> <world> <steps, 0 = forever> <dir> [fault]
//   fault: hang:<rank>:<step> | die:<rank>:<step>, acted on in attempt 0 only, so the restarted
//   job completes; diealways:<rank>:<step> in every attempt; slow:<rank>:<ms> sleeps in that rank's
//   data section every step.
// Writes <dir>/pid_<rank>_<attempt> so a test can find (and signal) it.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "resil/heartbeat.h"
#include "resil/protocol.h"

using namespace loom::resil;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: fake_rank rank world steps dir [fault]\n");
    return 2;
  }
  int rank = std::atoi(argv[1]), world = std::atoi(argv[2]);
  long steps = std::atol(argv[3]);
  std::string dir = argv[4], fault = argc > 5 ? argv[5] : "";
  const char* a = std::getenv(kEnvAttempt);
  int attempt = a ? std::atoi(a) : 0;
  std::ofstream(dir + "/pid_" + std::to_string(rank) + "_" + std::to_string(attempt))
      << getpid() << "\n";
  char kind[16] = "";
  int fr = -1;
  long arg = 0;
  if (!fault.empty()) std::sscanf(fault.c_str(), "%15[a-z]:%d:%ld", kind, &fr, &arg);
  std::string k = kind;
  int slow_ms = k == "slow" && fr == rank ? int(arg) : 0;
  // "diealways" fails every attempt (the restart-limit test); the others only the first.
  bool act = fr == rank && (attempt == 0 || k == "diealways");
  try {
    heartbeat_start(rank, world, dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fake_rank: %s\n", e.what());
    return 1;
  }
  auto nap = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  for (long s = 1; steps == 0 || s <= steps; ++s) {
    if (act && (k == "die" || k == "diealways") && s == arg) raise(SIGKILL);
    heartbeat_section(Section::Data, s);
    nap(2 + slow_ms);
    heartbeat_section(Section::ForwardBackward, s);
    if (act && k == "hang" && s == arg)
      for (;;) nap(1000);  // a hung collective: alive, silent
    nap(15);
    heartbeat_section(Section::Optimizer, s);
    nap(2);
    heartbeat_step_done(s);
  }
  return 0;
}
