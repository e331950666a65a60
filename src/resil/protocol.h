// The heartbeat protocol between a rank and its supervisor (`loom launch`, `loom supervise`):
// one JSON object per line over a TCP connection the rank opens to the address in
// LOOM_SUPERVISOR. A connection starts with a hello naming the rank; then section begins, step
// ends and, when the process exits by itself, a bye. The supervisor sends back one line, "stop",
// when it stops the job (the rank then exits; see heartbeat.h).
#pragma once

#include <cstdint>
#include <string>

namespace loom::resil {

// Environment variables the supervisor sets for the ranks (and mpirun forwards with -x).
inline constexpr const char* kEnvAddress = "LOOM_SUPERVISOR";          // host:port
inline constexpr const char* kEnvToken = "LOOM_SUPERVISOR_TOKEN";      // random, per job
inline constexpr const char* kEnvAttempt = "LOOM_SUPERVISOR_ATTEMPT";  // 0, 1, ... per restart

enum class MsgKind { Hello, Section, Step, Bye };

struct Message {
  MsgKind kind = MsgKind::Hello;
  // hello
  std::string token;
  int64_t attempt = 0;
  int64_t rank = -1;
  int64_t world = 0;
  int64_t pid = 0;
  std::string host;
  std::string run_dir;  // where the supervisor may write its events file ("" = not known)
  // Optional (-1 = not sent): the rank's set-up before its hello, in seconds (the trainer: from
  // its constructor's start, model build included), and the part of it spent reading and
  // verifying the checkpoint it resumed from; the supervisor's restart-time breakdown.
  double setup_seconds = -1;
  double restore_seconds = -1;
  // section / step: the step as the trainer's log counts it (1 = the first step)
  int64_t step = 0;
  std::string section;  // section: its name ([a-z_]{1,32})
  double seconds = 0;   // step: the rank's own measure of the step's wall time
};

std::string encode(const Message& m);  // one line, without the newline

// Parses one line; throws loom::Error saying what is wrong (not JSON, a missing or mistyped
// field, an unknown event, a number out of range). `where` names the sender in the message.
Message decode(const std::string& line, const std::string& where);

}  // namespace loom::resil
