// `loom launch -n N [options] -- <loom command and args>`: starts N local ranks of a loom
// command through mpirun, prefixes every output line with its rank, and supervises them
// (src/resil/supervisor.h): a rank that dies, fails or hangs stops the whole job, which is
// restarted up to --max-restarts times. `loom supervise [options] -- <launcher command>` does
// the same around any launcher (srun inside a Slurm allocation, mpirun with a hostfile).
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "resil/protocol.h"
#include "resil/supervisor.h"

namespace loom::cli {

namespace {

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  LOOM_CHECK(n > 0, "cannot find the loom executable (/proc/self/exe)");
  return std::string(buf, n);
}

// Splits at the first "--": the options before, the command after.
void split_command(const Args& all, Args* mine, Args* command) {
  bool after = false;
  for (auto& a : all) {
    if (!after && a == "--") {
      after = true;
      continue;
    }
    (after ? *command : *mine).push_back(!after && a == "-n" ? "--nproc" : a);
  }
}

constexpr const char* kSupervisionHelp =
    "Supervision: every rank of a `train` command reports its steps and sections over a TCP\n"
    "connection (LOOM_SUPERVISOR). A rank that dies, fails or stays silent past its timeout\n"
    "(calibrated: --timeout-multiplier x the longest time that phase took, within\n"
    "[--timeout-floor, --timeout-cap]) stops every rank, and the job is restarted (it resumes\n"
    "from its newest checkpoint) up to --max-restarts times, the back-off doubling each time.\n"
    "SIGINT/SIGTERM stop every rank. Stragglers (score = median step work / rank's, below\n"
    "--straggler-threshold for --straggler-patience steps) are named in the log. Events go to\n"
    "--events (default: <train.out_dir>/supervisor.jsonl). See docs/resilience.md.";

void supervision_options(Options& o) {
  o.value("max-restarts", "0", "restarts after a failure before giving up")
      .value("backoff", "1",
             "seconds before restarting an attempt that failed before its first step (doubles each "
             "time; one that trained restarts at once)")
      .value("backoff-max", "60", "longest back-off, seconds")
      .value("hang-timeout", "0", "fixed silence timeout in seconds (0: calibrated)")
      .value("timeout-multiplier", "5", "calibrated timeout = this x the longest phase seen")
      .value("timeout-floor", "10", "shortest calibrated timeout, seconds")
      .value("timeout-cap", "600", "longest calibrated timeout, seconds")
      .value("startup-timeout", "300",
             "seconds allowed for start-up and for a phase not yet seen to end")
      .value("kill-grace", "2", "seconds between SIGTERM and SIGKILL when stopping the job")
      .value("straggler-threshold", "0.75", "a rank scoring below this is slow")
      .value("straggler-patience", "5", "consecutive slow steps before a rank is named")
      .value("events", "", "supervisor events (JSONL); default <train.out_dir>/supervisor.jsonl")
      .value("heartbeats", "on", "on | off (off: no hang or straggler detection)");
}

void read_supervision(const Options& o, resil::SupervisorOptions* s) {
  s->max_restarts = o.get_int32("max-restarts", 0, 1000000);
  s->backoff = o.get_double("backoff");
  s->backoff_max = o.get_double("backoff-max");
  s->timeouts.fixed = o.get_double("hang-timeout");
  s->timeouts.multiplier = o.get_double("timeout-multiplier");
  s->timeouts.floor = o.get_double("timeout-floor");
  s->timeouts.cap = o.get_double("timeout-cap");
  s->timeouts.startup = o.get_double("startup-timeout");
  s->kill_grace = o.get_double("kill-grace");
  s->stragglers.threshold = o.get_double("straggler-threshold");
  s->stragglers.patience = o.get_int32("straggler-patience", 1, 1000000);
  s->events_path = o.get("events");
  std::string hb = o.get("heartbeats");
  LOOM_CHECK(hb == "on" || hb == "off", "--heartbeats must be on or off, got '", hb, "'");
  s->heartbeats = hb == "on";
}

bool has_arg(const Args& a, const std::string& s) {
  for (auto& x : a)
    if (x == s) return true;
  return false;
}

}  // namespace

int run_launch(const Args& all) {
  Args mine, command;
  split_command(all, &mine, &command);
  Options o(
      "loom launch -n N [--mpirun PATH] [--threads T] [supervision options] -- <command> "
      "[args...]",
      std::string("Runs N ranks of a loom command on this machine (through OpenMPI's "
                  "mpirun), with each\noutput line prefixed by its rank. The ranks read "
                  "their layout from [parallel] in the config\n(tp, dp, ...; see "
                  "docs/parallel.md). Example:\n"
                  "  loom launch -n 4 --max-restarts 3 -- train --config configs/main.toml "
                  "--set parallel.tp=2\n\n") +
          kSupervisionHelp);
  o.value("nproc", "", "number of ranks (-n)", true)
      .value("mpirun", "mpirun", "the MPI launcher to run")
      .value("threads", "0", "OpenMP threads per rank (0: cores / ranks, at least 1)");
  supervision_options(o);
  if (!o.parse(mine)) return 0;
  int64_t n = o.get_int("nproc");
  LOOM_CHECK(n >= 1 && n <= 4096, "-n must lie in [1, 4096], got ", n);
  LOOM_CHECK(!command.empty(),
             "nothing to launch: give the loom command after '--' (e.g. -- train "
             "--config run.toml)");
  int64_t threads = o.get_int("threads", 0, kMaxThreads);
  if (threads <= 0) threads = std::max<int64_t>(1, sysconf(_SC_NPROCESSORS_ONLN) / n);

  resil::SupervisorOptions s;
  read_supervision(o, &s);
  s.name = "loom launch";
  s.world = static_cast<int>(n);
  s.expect_heartbeats = command[0] == "train";
  s.tagged_output = true;
  s.untagged_prefix = "[mpirun] ";
  s.command = {o.get("mpirun"),
               "--oversubscribe",
               "--bind-to",
               "none",
               "--tag-output",
               "-n",
               std::to_string(n),
               "-x",
               "OMP_NUM_THREADS=" + std::to_string(threads)};
  // Ranks on other hosts get the supervisor's address only when mpirun forwards it.
  for (const char* v : {resil::kEnvAddress, resil::kEnvToken, resil::kEnvAttempt}) {
    s.command.push_back("-x");
    s.command.push_back(v);
  }
  if (geteuid() == 0) s.command.push_back("--allow-run-as-root");  // containers often run as root
  s.command.push_back(self_exe());
  for (auto& c : command) s.command.push_back(c);
  return resil::supervise(s);
}

int run_supervise(const Args& all) {
  Args mine, command;
  split_command(all, &mine, &command);
  Options o(
      "loom supervise [-n N] [--bind HOST] [--advertise HOST] [supervision options] -- "
      "<launcher command> [args...]",
      std::string("Supervises a job started by any launcher, e.g. inside a Slurm "
                  "allocation:\n"
                  "  loom supervise -n 64 --max-restarts 5 -- srun loom train --config "
                  "run.toml\n"
                  "The ranks connect back to this process: srun passes its environment "
                  "on; mpirun on\nseveral hosts needs -x LOOM_SUPERVISOR -x "
                  "LOOM_SUPERVISOR_TOKEN -x LOOM_SUPERVISOR_ATTEMPT.\n\n") +
          kSupervisionHelp);
  o.value("nproc", "0", "ranks expected (0: as the first rank says)")
      .value("bind", "0.0.0.0", "address the heartbeat socket listens on")
      .value("advertise", "", "host name the ranks connect to (default: this host's name)");
  supervision_options(o);
  if (!o.parse(mine)) return 0;
  LOOM_CHECK(!command.empty(),
             "nothing to supervise: give the launcher command after '--' (e.g. -- srun loom "
             "train --config run.toml)");
  resil::SupervisorOptions s;
  read_supervision(o, &s);
  s.name = "loom supervise";
  s.world = o.get_int32("nproc", 0, 1 << 24);
  s.expect_heartbeats = has_arg(command, "train");
  s.bind_host = o.get("bind");
  s.advertise_host = o.get("advertise");
  if (s.advertise_host.empty()) {
    char h[256] = "";
    gethostname(h, sizeof h - 1);
    s.advertise_host = h;
  }
  s.command = command;
  return resil::supervise(s);
}

}  // namespace loom::cli
