// Processes the supervisor starts and stops: the launcher in a process group of its own (so a
// signal reaches everything it started on this host, and the terminal's Ctrl-C reaches only the
// supervisor, which decides), and a sweep for whatever still carries the job's token in its
// environment (a rank the launcher lost track of, or one that moved to its own group).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace loom::resil {

// Starts argv[0] (looked up in PATH) as leader of a new process group, with `env` added to
// this process's environment, stdin from /dev/null and stdout + stderr into `out_fd`.
// Returns its pid (= its process group id); throws loom::Error when fork fails. A command that
// cannot be executed exits 127 after saying so on `out_fd`.
pid_t spawn_group(const std::vector<std::string>& argv,
                  const std::vector<std::pair<std::string, std::string>>& env, int out_fd);

// Pids of this host's processes whose environment holds exactly `entry` ("NAME=value"), this
// process excluded (only processes this user may read are seen).
std::vector<pid_t> processes_with_env(const std::string& entry);

}  // namespace loom::resil
