// Pipeline-parallel schedules as data: for each pipeline rank, the ordered list of what it does
// (forward or backward of which micro-batch on which model chunk, and the point-to-point sends
// and receives to its neighbours). A runtime walks the list; tests print it, simulate it and
// check it (deadlock freedom, activations in flight, bubble) without running a model.
//
// Stages. With p ranks and v virtual stages per rank (v = 1 except for the interleaved
// schedule), the model is cut into S = v*p stages. Rank r holds model chunks c = 0..v-1, and
// chunk c on rank r is global stage s = c*p + r (Megatron's layout), so consecutive stages sit
// on consecutive ranks and the activation of stage p-1 (rank p-1, chunk 0) goes to stage p
// (rank 0, chunk 1).
//
// Messages. The forward of stage s > 0 consumes the activation sent by stage s-1; the backward
// of stage s < S-1 consumes the activation gradient sent by stage s+1; the backward of the last
// stage starts from the loss. Messages between stages on the same rank (p = 1) stay local and
// get no send/receive actions.
#pragma once

#include <string>
#include <vector>

namespace loom::pp {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved };

// "gpipe", "1f1b", "interleaved" (for configs and messages); parse_schedule_kind throws
// loom::Error naming the accepted values.
const char* schedule_kind_name(ScheduleKind kind);
ScheduleKind parse_schedule_kind(const std::string& name);

enum class Op {
  Forward,   // run chunk `chunk` forward on micro-batch `microbatch`
  Backward,  // run its backward (needs the saved activations of that forward)
  SendAct,   // send the activation of (microbatch, chunk) to rank `peer`
  RecvAct,   // receive the activation feeding (microbatch, chunk) from rank `peer`
  SendGrad,  // send the input gradient of (microbatch, chunk) to rank `peer`
  RecvGrad,  // receive the output gradient of (microbatch, chunk) from rank `peer`
};
const char* op_name(Op op);

struct Action {
  Op op;
  int microbatch;
  int chunk;      // model chunk on this rank, 0..v-1 (the stage is chunk*p + rank)
  int peer = -1;  // the other rank of a send/receive; -1 for compute
  bool is_compute() const { return op == Op::Forward || op == Op::Backward; }
  bool operator==(const Action&) const = default;
};

struct Schedule {
  ScheduleKind kind;
  int p = 1;                               // pipeline ranks
  int m = 1;                               // micro-batches per step
  int v = 1;                               // model chunks (virtual stages) per rank
  std::vector<std::vector<Action>> ranks;  // ranks[r] = rank r's actions, in order

  int num_stages() const { return p * v; }
  int stage_of(int rank, int chunk) const { return chunk * p + rank; }
  int rank_of_stage(int stage) const { return stage % p; }
  int chunk_of_stage(int stage) const { return stage / p; }
};

// GPipe: every rank runs all m forwards, then all m backwards (m micro-batches in flight).
Schedule make_gpipe(int p, int m);
// 1F1B (PipeDream-Flush): rank r runs min(p-1-r, m) warm-up forwards, then alternates one
// forward and one backward, then drains the remaining backwards; at most p micro-batches in
// flight on any rank (p - r on rank r).
Schedule make_1f1b(int p, int m);
// Interleaved 1F1B with v model chunks per rank, in Megatron-Core's order: virtual micro-batch
// k (0..v*m-1) runs chunk (k mod p*v) / p (reversed for backwards) on micro-batch
// (k / (p*v))*p + k mod p; rank r runs 2(p-1-r) + (v-1)p warm-up forwards (all of them when
// m == p), then 1F1B, then the cool-down. Requires m % p == 0 (error otherwise, naming what
// would work). v = 1 gives plain 1F1B's order.
Schedule make_interleaved(int p, int m, int v);
// Dispatches on kind; v must be 1 unless kind is Interleaved.
Schedule make_schedule(ScheduleKind kind, int p, int m, int v = 1);

// Adds the send/receive actions to a schedule whose rank lists hold only compute actions.
// The communication is ordered by one global timeline (a unit-cost run of the compute
// actions), and each rank's list is that timeline's projection, with a message's send and
// receive at the same point of it. Hence the lists complete even when every send blocks until
// its receive is posted (rendezvous), whatever the real durations. The make_* functions call
// it; exposed for tests and for custom compute orders. Throws loom::Error if the compute
// orders cannot complete (a dependency cycle), naming a stuck rank.
void add_communication(Schedule& schedule);

// A text table for humans: one column per rank, one row per step of the unit-cost timeline
// (forward = 1 tick, backward = 2), e.g. "F3.1" = forward of micro-batch 3 on chunk 1, "B0",
// "." = idle. With show_comm, also each rank's full action list, sends and receives included.
std::string format_schedule(const Schedule& schedule, bool show_comm = false);

}  // namespace loom::pp
