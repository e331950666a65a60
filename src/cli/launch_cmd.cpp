// `loom launch -n N [options] -- <loom command and args>`: starts N local ranks of a loom
// command through mpirun, prefixes every output line with its rank, and when one rank fails,
// stops the job and says which rank failed. Running the command under mpirun or srun directly
// also works (the ranks find the launcher's environment themselves); this is the convenient,
// supervised way.
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"

namespace loom::cli {

namespace {

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  LOOM_CHECK(n > 0, "cannot find the loom executable (/proc/self/exe)");
  return std::string(buf, n);
}

// "[1,3]<stdout>:text" (mpirun --tag-output) -> rank 3, text. Returns -1 for untagged lines.
int untag(const std::string& line, std::string* text) {
  static const std::regex tag(R"(^\[\d+,(\d+)\]<(stdout|stderr)>:(.*)$)");
  std::smatch m;
  if (!std::regex_match(line, m, tag)) {
    *text = line;
    return -1;
  }
  *text = m[3];
  return std::stoi(m[1]);
}

}  // namespace

int run_launch(const Args& all) {
  // Everything after "--" is the loom command the ranks run.
  Args mine, command;
  bool after = false;
  for (auto& a : all) {
    if (!after && a == "--") {
      after = true;
      continue;
    }
    (after ? command : mine).push_back(a == "-n" && !after ? "--nproc" : a);
  }
  Options o("loom launch -n N [--mpirun PATH] [--threads T] -- <command> [args...]",
            "Runs N ranks of a loom command on this machine (through OpenMPI's mpirun), with each\n"
            "output line prefixed by its rank. If any rank fails, the whole job stops and the\n"
            "failing rank is named. The ranks read their layout from [parallel] in the config\n"
            "(tp, dp, ...; see docs/parallel.md). Example:\n"
            "  loom launch -n 4 -- train --config configs/main.toml --set parallel.tp=2");
  o.value("nproc", "", "number of ranks (-n)", true)
      .value("mpirun", "mpirun", "the MPI launcher to run")
      .value("threads", "0", "OpenMP threads per rank (0: cores / ranks, at least 1)");
  if (!o.parse(mine)) return 0;
  int64_t n = o.get_int("nproc");
  LOOM_CHECK(n >= 1 && n <= 4096, "-n must lie in [1, 4096], got ", n);
  LOOM_CHECK(!command.empty(),
             "nothing to launch: give the loom command after '--' (e.g. -- train "
             "--config run.toml)");
  int64_t threads = o.get_int("threads");
  if (threads <= 0) threads = std::max<int64_t>(1, sysconf(_SC_NPROCESSORS_ONLN) / n);

  std::vector<std::string> argv = {o.get("mpirun"),
                                   "--oversubscribe",
                                   "--bind-to",
                                   "none",
                                   "--tag-output",
                                   "-n",
                                   std::to_string(n),
                                   "-x",
                                   "OMP_NUM_THREADS=" + std::to_string(threads)};
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");  // containers often run as root
  argv.push_back(self_exe());
  for (auto& c : command) argv.push_back(c);

  int fds[2];
  LOOM_CHECK(pipe(fds) == 0, "pipe: ", std::strerror(errno));
  pid_t pid = fork();
  LOOM_CHECK(pid >= 0, "fork: ", std::strerror(errno));
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "loom launch: cannot run %s: %s\n", cargv[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  FILE* in = fdopen(fds[0], "r");
  std::string line, text;
  char buf[4096];
  int failed_rank = -1;
  std::string failure;
  static const std::regex loom_fail(R"(loom: rank (\d+) failed: (.*))");
  static const std::regex cmd_error(R"(^loom \S+: (?:internal )?error: (.*))");
  static const std::regex mpi_rank(
      R"((?:process rank (\d+))|(?:Process name: \[\[\d+,\d+\],(\d+)\]))");
  while (std::fgets(buf, sizeof buf, in)) {
    line += buf;
    if (line.empty() || line.back() != '\n') continue;
    line.pop_back();
    int rank = untag(line, &text);
    std::smatch m;
    if (failed_rank < 0 && std::regex_search(text, m, loom_fail)) {
      failed_rank = std::stoi(m[1]);
      failure = m[2];
    } else if (failed_rank < 0 && rank >= 0 && std::regex_search(text, m, cmd_error)) {
      failed_rank = rank;
      failure = m[1];
    } else if (failed_rank < 0 && rank < 0 && std::regex_search(text, m, mpi_rank)) {
      failed_rank = std::stoi(m[1].matched ? m[1] : m[2]);
    }
    if (rank >= 0)
      std::printf("[rank %d] %s\n", rank, text.c_str());
    else
      std::printf("[mpirun] %s\n", text.c_str());
    std::fflush(stdout);
    line.clear();
  }
  fclose(in);
  int status = 0;
  waitpid(pid, &status, 0);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 0) return 0;
  if (failed_rank >= 0)
    std::fprintf(stderr, "loom launch: rank %d failed%s%s; the job of %lld ranks was stopped\n",
                 failed_rank, failure.empty() ? "" : ": ", failure.c_str(),
                 static_cast<long long>(n));
  else
    std::fprintf(stderr, "loom launch: the job failed (mpirun exit code %d)\n", code);
  return code == 0 ? 1 : code;
}

}  // namespace loom::cli
