// The run directory's guards: the exclusive lock (run_lock.h) against a second process, a
// holder killed with SIGKILL, and the metrics log on a full disk.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "core/error.h"
#include "core/json.h"
#include "temp_dir.h"
#include "train/metrics.h"
#include "train/run_lock.h"

namespace loom {
namespace {

// A child process holding the lock of `dir` until it is killed.
pid_t hold_in_child(const std::string& dir) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    try {
      RunLock lock(dir);
      char ok = 1;
      if (::write(p[1], &ok, 1) != 1) ::_exit(2);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(3);
    }
  }
  ::close(p[1]);
  char c = 0;
  EXPECT_EQ(::read(p[0], &c, 1), 1) << "the child did not take the lock";
  ::close(p[0]);
  return pid;
}

std::string error_of(const std::string& dir) {
  try {
    RunLock lock(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunLock, ASecondProcessIsRefusedNamingTheHolder) {
  test::TempDir dir("runlock");
  pid_t holder = hold_in_child(dir.path);
  std::string err = error_of(dir.path);
  EXPECT_NE(
      err.find(dir.path + " is in use by another run (pid " + std::to_string(holder) + " on host "),
      std::string::npos)
      << err;
  EXPECT_NE(err.find("run.lock"), std::string::npos) << err;
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  // The kernel released the killed holder's lock; its record says it did not end cleanly.
  {
    RunLock lock(dir.path);
    EXPECT_NE(lock.stale_holder().find("pid " + std::to_string(holder)), std::string::npos)
        << lock.stale_holder();
  }
  RunLock again(dir.path);  // after a clean end: nothing stale
  EXPECT_EQ(again.stale_holder(), "");
}

TEST(RunLock, OneProcessMayTakeItTwice) {
  test::TempDir dir("runlock");
  RunLock a(dir.path);
  RunLock b(dir.path);
  EXPECT_EQ(b.stale_holder().find("pid " + std::to_string(::getpid())), 0u);
}

TEST(RunLock, AnUnwritableDirectoryIsNamed) {
  std::string err = error_of("/proc/no-such-dir");
  EXPECT_NE(err.find("/proc/no-such-dir/run.lock: cannot open"), std::string::npos) << err;
}

TEST(MetricsLog, AFullDiskStopsTheRunNamingTheFile) {
  MetricsLog log("/dev/full", false);
  Json j = Json::object();
  j["step"] = 1;
  j["loss"] = 2.5;
  try {
    log.write(j);
    FAIL() << "a write to /dev/full was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write the metrics log (No space left "
                                         "on device)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom
