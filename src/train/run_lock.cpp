#include "train/run_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "core/log.h"

namespace loom {

namespace {

std::string read_all(int fd) {
  std::string s;
  char buf[512];
  ssize_t n;
  for (off_t at = 0; s.size() < 4096 && (n = ::pread(fd, buf, sizeof buf, at)) > 0; at += n)
    s.append(buf, size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string holder_record() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  char when[64] = "?";
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return cat("pid ", ::getpid(), " on host ", host, " since ", when, "\n");
}

}  // namespace

RunLock::RunLock(const std::string& dir) : path_(dir + "/run.lock") {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LOOM_CHECK(fd_ >= 0, path_, ": cannot open the run directory's lock (", std::strerror(errno),
             ")");
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file
  if (::fcntl(fd_, F_SETLK, &whole) != 0) {
    const int err = errno;
    std::string holder = read_all(fd_);
    struct flock probe {};
    probe.l_type = F_WRLCK;
    probe.l_whence = SEEK_SET;
    const bool named = ::fcntl(fd_, F_GETLK, &probe) == 0 && probe.l_type != F_UNLCK;
    ::close(fd_);
    fd_ = -1;
    LOOM_CHECK(err == EACCES || err == EAGAIN, path_, ": cannot lock the run directory (",
               std::strerror(err), ")");
    if (holder.empty()) holder = named ? cat("pid ", probe.l_pid) : "holder unknown";
    fail(dir, " is in use by another run (", holder, ", holding ", path_,
         "): wait for it to end, or give this run another train.out_dir");
  }
  stale_ = read_all(fd_);
  const std::string me = holder_record();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    fail(path_, ": cannot write the run directory's lock (", std::strerror(err), ")");
  }
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // A failure is not fatal: the next run would only report this one as ended uncleanly.
  [[maybe_unused]] int rc = ::ftruncate(fd_, 0);
  ::close(fd_);
}

std::unique_ptr<RunLock> lock_run_dir(const std::string& dir) {
  auto lock = std::make_unique<RunLock>(dir);
  if (!lock->stale_holder().empty())
    log_warn("the previous run in ", dir, " (", lock->stale_holder(), ") ended without releasing ",
             lock->path(), " (killed or crashed)");
  return lock;
}

}  // namespace loom
