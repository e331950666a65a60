// The supervisor behind `loom launch` and `loom supervise`: runs a launcher command (mpirun,
// srun, or anything that starts the ranks), watches the ranks' heartbeats (heartbeat.h), and
// when a rank dies, hangs or fails, stops every rank and restarts the command (which resumes
// from the newest checkpoint) up to max_restarts times with a doubling back-off.
#pragma once

#include <string>
#include <vector>

#include "resil/straggler.h"
#include "resil/timeouts.h"

namespace loom::resil {

struct SupervisorOptions {
  std::vector<std::string> command;  // the launcher and its arguments
  std::string name = "loom launch";  // prefix of the supervisor's own messages
  int world = 0;                     // ranks expected; 0 = taken from the first hello
  // Whether the ranks are known to send heartbeats from the start (a loom train command).
  // Otherwise silence counts only once some rank has said hello.
  bool expect_heartbeats = true;
  int max_restarts = 0;
  // Seconds before a restart of an attempt that failed before its first step; doubles after each
  // such one. An attempt that ended a step restarts at once (and the back-off starts over).
  double backoff = 1;
  double backoff_max = 60;  // seconds
  double kill_grace = 2;    // seconds between SIGTERM and SIGKILL when stopping the job
  TimeoutPolicy timeouts;
  StragglerOptions stragglers;
  std::string events_path;  // "" = <run_dir>/supervisor.jsonl once a rank names its run_dir
  std::string bind_host = "127.0.0.1";  // where the heartbeat socket listens
  std::string advertise_host;           // what the ranks connect to ("" = bind_host)
  bool tagged_output = false;           // lines are mpirun --tag-output tagged: [rank N] them
  std::string untagged_prefix;          // prefix of other lines of the launcher's output
  bool heartbeats = true;               // false: no LOOM_SUPERVISOR for the ranks (no hang
                                        // detection, no stragglers; the overhead baseline)
  void validate() const;
};

// Runs the job to the end; returns the exit code for the command line: 0 when an attempt
// succeeded, 1 when it gave up, 128 + signal when SIGINT/SIGTERM stopped it.
int supervise(const SupervisorOptions& o);

}  // namespace loom::resil
