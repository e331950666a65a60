// The rank side of supervision: a trainer reports each step's sections and its end to the
// supervisor named by LOOM_SUPERVISOR (set by `loom launch` / `loom supervise`). Without that
// variable nothing is started and every call is one load and a branch.
//
// Why a TCP connection rather than heartbeat files in a shared directory: it works the same on
// one host and on many (the ranks already need the network for MPI; no shared filesystem and no
// NFS attribute caching in the way), costs no filesystem traffic per step, and a rank that dies
// (kill -9, segfault) closes its connection at once, so a crash is seen in milliseconds rather
// than after a timeout. The connection is also how the supervisor stops ranks it cannot signal
// (other hosts, a launcher that lost them): it sends "stop", or simply goes away, and a thread
// here ends the process.
#pragma once

#include <cstdint>
#include <string>

namespace loom::resil {

enum class Section { Data, ForwardBackward, Optimizer, Checkpoint, Eval };
const char* section_name(Section s);

class HeartbeatClient;
namespace detail {
extern HeartbeatClient* g_client;  // null when no supervisor is watching
void section(Section s, int64_t step);
void step_done(int64_t step);
}  // namespace detail

// Connects to the supervisor when LOOM_SUPERVISOR is set (throws loom::Error naming the address
// when it cannot); `run_dir` is where the supervisor may keep its events file. Call once per
// process; later calls do nothing. setup_seconds and restore_seconds (-1: not known) go into the
// hello for the supervisor's restart-time breakdown (protocol.h).
void heartbeat_start(int rank, int world, const std::string& run_dir, double setup_seconds = -1,
                     double restore_seconds = -1);

// `step` counts as the trainer's log does: the first step is 1.
inline void heartbeat_section(Section s, int64_t step) {
  if (detail::g_client) detail::section(s, step);
}
inline void heartbeat_step_done(int64_t step) {
  if (detail::g_client) detail::step_done(step);
}

}  // namespace loom::resil
