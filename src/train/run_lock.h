// An exclusive lock on a run directory (train.out_dir): two runs writing one directory would
// interleave their metrics and checkpoints. A POSIX record lock (fcntl F_SETLK) on
// <dir>/run.lock, held while the run lives: the kernel releases it when the process ends,
// however it ends, so a crashed run never leaves a lock that blocks the next one; the kernel
// also names the holder's pid, and the lock works on NFS (lockd). It is per process: a process
// taking it again (several trainers in one test process) gets it. The file holds the holder's
// pid, host and start time while the run lives and is emptied at a clean end: a file that is
// not empty when the lock is taken names a run that ended without its clean-up (killed or
// crashed).
#pragma once

#include <memory>
#include <string>

namespace loom {

class RunLock {
 public:
  // Takes the lock or throws loom::Error naming the directory and the holder (pid, host, since
  // when) when another process has it.
  explicit RunLock(const std::string& dir);
  ~RunLock();  // empties the file and releases the lock
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // The previous holder's record ("pid 123 on host h since ...") when it ended without its
  // clean-up; "" after a clean end or for a new directory.
  const std::string& stale_holder() const { return stale_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string stale_;
  int fd_ = -1;
};

// The lock of `dir`, with a warning when the previous holder ended without its clean-up.
std::unique_ptr<RunLock> lock_run_dir(const std::string& dir);

}  // namespace loom
