#include "resil/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace loom::resil {

pid_t spawn_group(const std::vector<std::string>& argv,
                  const std::vector<std::pair<std::string, std::string>>& env, int out_fd) {
  LOOM_CHECK(!argv.empty(), "nothing to run");
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = ::fork();
  LOOM_CHECK(pid >= 0, "fork: ", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) ::signal(s, SIG_DFL);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_fd, 1);
    ::dup2(out_fd, 2);
    for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", cargv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with a signal sent before the child ran
  return pid;
}

std::vector<pid_t> processes_with_env(const std::string& entry) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  pid_t self = ::getpid();
  std::string buf;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end || pid == self) continue;
    std::string path = std::string("/proc/") + e->d_name + "/environ";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // gone, or another user's
    buf.clear();
    char chunk[65536];
    ssize_t n;
    while ((n = ::read(fd, chunk, sizeof chunk)) > 0) buf.append(chunk, size_t(n));
    ::close(fd);
    for (size_t pos = 0; pos < buf.size();) {
      size_t z = buf.find('\0', pos);
      if (z == std::string::npos) z = buf.size();
      if (buf.compare(pos, z - pos, entry) == 0) {
        out.push_back(pid_t(pid));
        break;
      }
      pos = z + 1;
    }
  }
  ::closedir(d);
  return out;
}

}  // namespace loom::resil
