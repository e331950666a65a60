// Executes every rank's action list of a pipeline schedule together, as a runtime would, but
// with costs instead of a model: point-to-point channels per (sender, receiver, activation or
// gradient), FIFO; a receive must match the message at the head of its channel. Reports
// completion with the measured timeline (makespan, bubble, activations in flight) or why not:
// deadlock (every unfinished rank blocked; the stuck ranks and actions named) or an invalid
// schedule (a compute before its input arrived, a message that does not match, work missing or
// repeated, messages never received).
#pragma once

#include <string>
#include <vector>

#include "parallel/schedule/pipeline_schedule.h"

namespace loom::pp {

enum class SendMode {
  Eager,       // a send completes at once (isend into an unbounded buffer)
  Rendezvous,  // a send blocks until the receiver reaches the matching receive (strictest)
};

// Durations of one forward and one backward of a whole stage's layers, for one micro-batch
// (a model chunk costs 1/v of it); communication costs `comm` (its latency; 0 by default).
struct CostModel {
  double forward = 1.0;
  double backward = 2.0;
  double comm = 0.0;
};

struct SimResult {
  enum class Status { Completed, Deadlock, Invalid } status = Status::Completed;
  std::string message;  // for Deadlock / Invalid: what went wrong, naming ranks and actions
  struct Stuck {
    int rank;
    int action_index;
    Action action;
  };
  std::vector<Stuck> stuck;  // Deadlock: every blocked rank and the action it waits in

  double makespan = 0.0;                   // time the last rank finishes
  double ideal = 0.0;                      // m * (forward + backward): one rank's work
  double bubble = 0.0;                     // (makespan - ideal) / ideal
  std::vector<double> busy;                // per rank: time spent computing
  std::vector<int> peak_in_flight;         // per rank: most (micro-batch, chunk) forwards
                                           // whose backward had not yet run
  std::vector<std::vector<double>> start;  // per rank, per action: start time (completed runs)

  bool completed() const { return status == Status::Completed; }
  int max_in_flight() const;
};

SimResult simulate(const Schedule& schedule, const CostModel& cost = {},
                   SendMode mode = SendMode::Eager);

// "rank 2 action 5 (RecvGrad mb 3 chunk 0 from 3)".
std::string describe_action(int rank, int index, const Action& action);

}  // namespace loom::pp
