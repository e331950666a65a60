// The supervisor around fake ranks (fake_rank.cpp): no MPI and no training, so each case takes
// a second or two. The real trainer under `loom launch` is tested by chaos.sh and the straggler
// test (CMakeLists.txt).
#include "resil/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "resil/output_lines.h"
#include "resil/protocol.h"
#include "temp_dir.h"

namespace loom::resil {
namespace {

std::string fake(int rank, int world, int steps, const std::string& dir,
                 const std::string& fault = "") {
  return std::string(LOOM_FAKE_RANK) + " " + std::to_string(rank) + " " + std::to_string(world) +
         " " + std::to_string(steps) + " " + dir + " " + fault;
}

SupervisorOptions options(const test::TempDir& dir, const std::string& script) {
  SupervisorOptions o;
  o.name = "supervisor test";
  o.command = {"bash", "-c", script};
  o.world = 2;
  o.backoff = 0.05;
  o.kill_grace = 0.5;
  o.timeouts.floor = 0.5;
  o.timeouts.cap = 2;
  o.timeouts.startup = 10;
  o.events_path = dir / "events.jsonl";
  return o;
}

std::vector<std::string> events(const test::TempDir& dir) {
  std::ifstream f(dir / "events.jsonl");
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

int count(const std::vector<std::string>& ev, std::initializer_list<std::string> parts) {
  int n = 0;
  for (auto& l : ev) {
    bool all = true;
    for (auto& p : parts) all = all && l.find(p) != std::string::npos;
    n += all;
  }
  return n;
}

std::string dump(const std::vector<std::string>& ev) {
  std::string s;
  for (auto& l : ev) s += l + "\n";
  return s;
}

int64_t pid_of(const test::TempDir& dir, int rank, int attempt) {
  std::ifstream f(dir / ("pid_" + std::to_string(rank) + "_" + std::to_string(attempt)));
  int64_t p = 0;
  f >> p;
  return p;
}

// Gone, or a zombie nobody has reaped yet: either way it runs no more.
bool gone(int64_t pid) {
  for (int i = 0; i < 250; ++i) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string s;
    if (!std::getline(f, s)) return true;
    size_t p = s.rfind(')');
    if (p != std::string::npos && p + 2 < s.size() && s[p + 2] == 'Z') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(Supervisor, AHealthyJobCompletes) {
  test::TempDir dir("super");
  auto o = options(dir, fake(0, 2, 10, dir.path) + " & " + fake(1, 2, 10, dir.path) + " & wait");
  EXPECT_EQ(supervise(o), 0);
  auto ev = events(dir);
  EXPECT_EQ(count(ev, {"\"rank_up\""}), 2) << dump(ev);
  EXPECT_EQ(count(ev, {"\"done\""}), 1) << dump(ev);
  EXPECT_EQ(count(ev, {"\"restart\""}), 0) << dump(ev);
}

TEST(Supervisor, AHungRankIsDetectedStoppedAndTheJobRestarted) {
  test::TempDir dir("super");
  auto o = options(
      dir, fake(0, 2, 12, dir.path) + " & " + fake(1, 2, 12, dir.path, "hang:1:8") + " & wait");
  o.max_restarts = 1;
  EXPECT_EQ(supervise(o), 0);
  auto ev = events(dir);
  EXPECT_EQ(count(ev, {"\"event\": \"hung\"", "\"rank\": 1", "\"step\": 8",
                       "\"section\": \"forward_backward\""}),
            1)
      << dump(ev);
  EXPECT_EQ(count(ev, {"\"restart\"", "rank 1 failed: hung at step 8"}), 1) << dump(ev);
  EXPECT_EQ(count(ev, {"\"done\"", "\"attempt\": 1"}), 1) << dump(ev);
  EXPECT_TRUE(gone(pid_of(dir, 1, 0))) << "the hung rank was left running";
}

TEST(Supervisor, ADeadRankIsNamedAndTheJobGivesUpAtTheLimit) {
  test::TempDir dir("super");
  auto o = options(
      dir, fake(0, 2, 0, dir.path) + " & " + fake(1, 2, 0, dir.path, "diealways:1:4") + " & wait");
  o.max_restarts = 2;
  testing::internal::CaptureStderr();
  int rc = supervise(o);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("rank 1 failed: died after step 3"), std::string::npos) << err;
  EXPECT_NE(err.find("giving up after 2 restart(s), --max-restarts 2"), std::string::npos) << err;
  auto ev = events(dir);
  EXPECT_EQ(count(ev, {"\"event\": \"died\"", "\"rank\": 1"}), 3) << dump(ev);
  EXPECT_EQ(count(ev, {"\"restart\""}), 2) << dump(ev);
  EXPECT_EQ(count(ev, {"\"gave_up\"", "\"restarts\": 2"}), 1) << dump(ev);
  // Rank 0 runs forever by itself: the supervisor stopped it every time.
  for (int a = 0; a < 3; ++a) EXPECT_TRUE(gone(pid_of(dir, 0, a))) << "attempt " << a;
}

// Rank 1 speaks the protocol by hand (bash's /dev/tcp): its hello, then a malformed line; a
// stranger claims rank 7, another has the wrong token, a third sends no hello.
TEST(Supervisor, BadHeartbeatsAreNamedAndDoNotStopTheJob) {
  test::TempDir dir("super");
  std::string raw = R"(
    host=${LOOM_SUPERVISOR%:*}; port=${LOOM_SUPERVISOR##*:}
    hello() { printf '{"ev":"hello","token":"%s","attempt":%s,"rank":%s,"world":2,"pid":%s,"host":"h","run_dir":""}\n' "$1" "$LOOM_SUPERVISOR_ATTEMPT" "$2" $$; }
    exec 3<>/dev/tcp/$host/$port; hello "$LOOM_SUPERVISOR_TOKEN" 1 >&3
    echo '{"ev":"section","step":"two","name":"data"}' >&3
    exec 4<>/dev/tcp/$host/$port; hello "$LOOM_SUPERVISOR_TOKEN" 7 >&4
    exec 5<>/dev/tcp/$host/$port; hello "not-the-token" 0 >&5
    exec 6<>/dev/tcp/$host/$port; echo 'garbage' >&6
    sleep 0.5; echo '{"ev":"bye"}' >&3
  )";
  auto o = options(dir, fake(0, 2, 20, dir.path) + " & (" + raw + ") & wait");
  EXPECT_EQ(supervise(o), 0);
  auto ev = events(dir);
  EXPECT_EQ(count(ev, {"bad_heartbeat", "malformed heartbeat from rank 1", "field 'step'",
                       "line ignored"}),
            1)
      << dump(ev);
  EXPECT_EQ(count(ev, {"bad_heartbeat", "unknown rank 7", "this job has 2 ranks"}), 1) << dump(ev);
  EXPECT_EQ(count(ev, {"bad_heartbeat", "wrong job token"}), 1) << dump(ev);
  EXPECT_EQ(count(ev, {"bad_heartbeat", "malformed heartbeat from an unknown sender"}), 1)
      << dump(ev);
  EXPECT_EQ(count(ev, {"\"done\""}), 1) << dump(ev);
}

TEST(Supervisor, SigtermReachesEveryRank) {
  test::TempDir dir("super");
  auto o = options(dir, fake(0, 2, 0, dir.path) + " & " + fake(1, 2, 0, dir.path) + " & wait");
  o.max_restarts = 5;  // a signal is not a failure to restart from
  std::thread killer([&] {
    for (int i = 0; i < 500 && !(pid_of(dir, 0, 0) && pid_of(dir, 1, 0)); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(::getpid(), SIGTERM);
  });
  int rc = supervise(o);
  killer.join();
  EXPECT_EQ(rc, 128 + SIGTERM);
  EXPECT_TRUE(gone(pid_of(dir, 0, 0)));
  EXPECT_TRUE(gone(pid_of(dir, 1, 0)));
  EXPECT_EQ(count(events(dir), {"\"signal\""}), 1);
}

// The supervisor's stdout sent to `path` while it lives (the ranks' lines go there, not into the
// test log).
class StdoutTo {
 public:
  explicit StdoutTo(const std::string& path) {
    std::fflush(stdout);
    saved_ = ::dup(1);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::close(fd);
  }
  ~StdoutTo() {
    std::fflush(stdout);
    ::dup2(saved_, 1);
    ::close(saved_);
  }

 private:
  int saved_ = -1;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

long peak_rss_mb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

// A launcher whose output is not heartbeats: only the output and the exit code matter.
SupervisorOptions output_only(const test::TempDir& dir, const std::string& script) {
  auto o = options(dir, script);
  o.world = 0;
  o.expect_heartbeats = false;
  o.tagged_output = true;
  return o;
}

TEST(SupervisorOutput, AOneMegabyteLineWithoutNewlineIsCutIntoBoundedLines) {
  test::TempDir dir("super");
  auto o =
      output_only(dir, "printf '[1,0]<stdout>:'; head -c 1000000 /dev/zero | tr '\\0' x; exit 0");
  int rc;
  {
    StdoutTo out(dir / "out");
    rc = supervise(o);
  }
  EXPECT_EQ(rc, 0);
  std::string out = read_all(dir / "out");
  size_t xs = 0, lines = 0;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l); ++lines) {
    ASSERT_EQ(l.rfind("[rank 0] ", 0), 0u) << l.substr(0, 40);
    EXPECT_LE(l.size(), kMaxOutputLine + 9);
    xs += std::count(l.begin(), l.end(), 'x');
  }
  EXPECT_EQ(xs, 1000000u);
  EXPECT_EQ(lines, (1000000 + 14 + kMaxOutputLine - 1) / kMaxOutputLine);
}

TEST(SupervisorOutput, AHundredMegabyteLineKeepsMemoryBounded) {
  test::TempDir dir("super");
  auto o = output_only(dir,
                       "printf '[1,0]<stdout>:loom '; head -c 100000000 /dev/zero | tr '\\0' x; "
                       "exit 0");
  long before = peak_rss_mb();
  int rc;
  {
    StdoutTo out("/dev/null");
    rc = supervise(o);
  }
  EXPECT_EQ(rc, 0);
  EXPECT_LT(peak_rss_mb() - before, 32) << "peak RSS grew from " << before << " MB";
}

TEST(SupervisorOutput, BinaryOutputPassesThroughAndTheExitCodeCounts) {
  test::TempDir dir("super");
  {
    std::ifstream r("/dev/urandom", std::ios::binary);
    std::string b(1 << 22, '\0');
    r.read(b.data(), b.size());
    std::ofstream(dir / "bin", std::ios::binary) << b;
  }
  auto o = output_only(dir, "cat " + (dir / "bin") + "; exit 3");
  o.tagged_output = false;
  int rc;
  testing::internal::CaptureStderr();
  {
    StdoutTo out(dir / "out");
    rc = supervise(o);
  }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("the launcher exited with code 3"), std::string::npos) << err;
  // The same bytes, NULs included; only newlines were added (one per cut piece and at the end).
  auto strip = [](std::string s) {
    s.erase(std::remove(s.begin(), s.end(), '\n'), s.end());
    return s;
  };
  EXPECT_TRUE(strip(read_all(dir / "out")) == strip(read_all(dir / "bin")));
}

// `yes` keeps the output pipe full for the whole job: the heartbeats are still read (the healthy
// ranks are not called hung), a hung rank is still found, and the restarted job completes.
TEST(SupervisorOutput, AFloodingRankDoesNotBlindTheSupervisor) {
  test::TempDir dir("super");
  auto o = options(dir, "yes & y=$!; " + fake(0, 2, 40, dir.path) + " & a=$!; " +
                            fake(1, 2, 40, dir.path, "hang:1:8") +
                            " & b=$!; wait $a; ra=$?; wait $b; rb=$?; kill $y; exit $((ra | rb))");
  o.max_restarts = 1;
  o.timeouts.startup = 20;
  long before = peak_rss_mb();
  int rc;
  {
    StdoutTo out("/dev/null");
    rc = supervise(o);
  }
  EXPECT_EQ(rc, 0);
  auto ev = events(dir);
  EXPECT_EQ(count(ev, {"\"event\": \"hung\"", "\"rank\": 1", "\"step\": 8"}), 1) << dump(ev);
  EXPECT_EQ(count(ev, {"\"done\"", "\"attempt\": 1"}), 1) << dump(ev);
  EXPECT_LT(peak_rss_mb() - before, 32) << "peak RSS grew from " << before << " MB";
}

TEST(Supervisor, ImpossibleOptionsAreRefused) {
  test::TempDir dir("super");
  auto o = options(dir, "true");
  o.max_restarts = -1;
  EXPECT_THROW(supervise(o), Error);
  o = options(dir, "true");
  o.timeouts.cap = 0.1;  // below the floor
  EXPECT_THROW(supervise(o), Error);
}

}  // namespace
}  // namespace loom::resil
