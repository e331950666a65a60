#include "resil/supervisor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "resil/output_lines.h"
#include "resil/process.h"
#include "resil/protocol.h"

namespace loom::resil {

void SupervisorOptions::validate() const {
  LOOM_CHECK(!command.empty(), "nothing to run: give the command after '--'");
  LOOM_CHECK(world >= 0 && world <= (1 << 24), "the number of ranks must lie in [0, 2^24]");
  LOOM_CHECK(max_restarts >= 0 && max_restarts <= 1000000,
             "--max-restarts must lie in [0, 1000000], got ", max_restarts);
  LOOM_CHECK(std::isfinite(backoff) && backoff >= 0 && std::isfinite(backoff_max) &&
                 backoff_max >= backoff,
             "--backoff must be >= 0 seconds and --backoff-max >= --backoff");
  LOOM_CHECK(std::isfinite(kill_grace) && kill_grace >= 0 && kill_grace <= 3600,
             "--kill-grace must lie in [0, 3600] seconds, got ", kill_grace);
  timeouts.validate();
  stragglers.validate();
}

namespace {

int g_signal_pipe[2] = {-1, -1};

void on_signal(int s) {
  char c = static_cast<char>(s);
  ssize_t n = ::write(g_signal_pipe[1], &c, 1);
  (void)n;
}

double wall_clock() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string random_token() {
  unsigned char b[16] = {};
  std::ifstream f("/dev/urandom", std::ios::binary);
  f.read(reinterpret_cast<char*>(b), sizeof b);
  LOOM_CHECK(f.gcount() == sizeof b, "cannot read /dev/urandom for the job token");
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

std::string this_host() {
  char h[256] = "";
  ::gethostname(h, sizeof h - 1);
  return h;
}

// 'T' (stopped) or 't' (traced) in /proc/<pid>/stat: a rank that cannot run.
bool process_stopped(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(f, s);
  size_t p = s.rfind(')');
  return p != std::string::npos && p + 2 < s.size() && (s[p + 2] == 'T' || s[p + 2] == 't');
}

struct RankState;
std::string where(const RankState& rs);

struct Cause {
  std::string kind;  // died, hung, error, exit
  int rank = -1;
  int64_t step = 0;
  std::string section;
  std::string text;  // what happened, for the log
};

struct Conn {
  int fd = -1;
  std::string peer;
  std::string buf;
  int rank = -1;  // bound by its hello
};

struct RankState {
  bool hello = false, bye = false, lost = false;
  double last = 0;     // when it last said something (now_seconds)
  double lost_at = 0;  // when its connection closed without a goodbye
  std::string phase = "init";
  int64_t step = 0;   // the step it is in (or ended last)
  int64_t ended = 0;  // the last step it ended
  int64_t pid = 0;
  std::string host;
};

// "at step 8 in forward_backward", "after step 7", "while starting".
std::string where(const RankState& rs) {
  if (rs.phase == "step") return cat("after step ", rs.step);
  if (rs.phase == "init") return "while starting (after its hello)";
  return cat("at step ", rs.step, " in ", rs.phase);
}

// The machine-readable log: one JSON object per line, kept in memory until its path is known
// (a rank names its run directory in its hello).
class Events {
 public:
  explicit Events(std::string path) : path_(std::move(path)) {}
  void set_default_dir(const std::string& dir) {
    if (path_.empty() && !dir.empty()) path_ = dir + "/supervisor.jsonl";
  }
  void write(Json j) {
    // Milliseconds since the epoch, as an integer: the JSON writer rounds doubles to 9 digits.
    j["time_ms"] = static_cast<int64_t>(wall_clock() * 1000);
    pending_.push_back(j.dump());
    flush();
  }
  void flush() {
    if (path_.empty() || pending_.empty()) return;
    if (!f_) {
      f_ = std::fopen(path_.c_str(), "a");
      if (!f_) {
        if (!warned_)
          std::fprintf(stderr, "warning: cannot open %s for the supervisor's events: %s\n",
                       path_.c_str(), std::strerror(errno));
        warned_ = true;
        return;
      }
    }
    for (auto& l : pending_) std::fprintf(f_, "%s\n", l.c_str());
    std::fflush(f_);
    pending_.clear();
  }
  ~Events() {
    if (f_) std::fclose(f_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> pending_;
  FILE* f_ = nullptr;
  bool warned_ = false;
};

class Supervisor {
 public:
  explicit Supervisor(const SupervisorOptions& o)
      : o_(o), timeouts_(o.timeouts), events_(o.events_path), world_(o.world) {}
  ~Supervisor() {
    for (auto& c : conns_) ::close(c->fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }

  int run();

 private:
  enum class Outcome { Success, Failed, Signalled };
  template <typename... A>
  void say(const A&... a) {
    std::fprintf(stderr, "%s: %s\n", o_.name.c_str(), cat(a...).c_str());
    std::fflush(stderr);
  }
  void listen_socket();
  Outcome run_attempt();
  void accept_all(double now);
  void read_conn(Conn& c, double now);
  bool all_connections_closed();
  void handle_line(Conn& c, const std::string& line, double now);
  void bad_heartbeat(const Conn& c, const std::string& why);
  void read_output(bool drain);
  void output_line(std::string_view line, bool continued);
  void check_silence(double now);
  void set_cause(Cause c) {
    if (!cause_) cause_ = std::move(c);
  }
  Cause error_cause() const {
    Cause c{"error", output_cause_.rank, 0, "", output_cause_.text};
    auto it = ranks_.find(c.rank);
    if (it != ranks_.end()) {
      c.step = it->second.step;
      c.section = it->second.phase;
    }
    return c;
  }
  void stop_job();
  bool child_alive();
  void signal_job(int sig);
  std::string describe(const Cause& c) const;
  Json cause_json(const Cause& c) const;

  SupervisorOptions o_;
  PhaseTimeouts timeouts_;
  Events events_;
  int world_;
  std::string token_ = random_token();
  std::string host_ = this_host();
  int listen_fd_ = -1;
  int port_ = 0;
  int attempt_ = 0;
  double attempt_start_ = 0;
  bool any_hello_ = false;
  pid_t child_ = -1;
  int child_status_ = 0;
  bool child_reaped_ = false;
  int out_fd_ = -1;
  LineSplitter out_lines_;
  int out_rank_ = -1;  // the rank of the last output line (a cut line's next pieces are its)
  int signal_ = 0;
  int64_t steps_this_attempt_ = 0;
  std::optional<Cause> cause_;
  Cause output_cause_;       // a rank's own error message in the launcher's output
  int mpi_named_rank_ = -1;  // the rank mpirun's failure message named
  std::map<int, RankState> ranks_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::unique_ptr<StragglerDetector> stragglers_;
};

void Supervisor::listen_socket() {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(o_.bind_host.c_str(), "0", &hints, &res);
  LOOM_CHECK(rc == 0, "cannot resolve '", o_.bind_host,
             "' to listen for heartbeats: ", gai_strerror(rc));
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  LOOM_CHECK(listen_fd_ >= 0, "socket: ", std::strerror(errno));
  int ok = ::bind(listen_fd_, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  LOOM_CHECK(ok == 0, "cannot listen for heartbeats on ", o_.bind_host, ": ", std::strerror(errno));
  LOOM_CHECK(::listen(listen_fd_, 1024) == 0, "listen: ", std::strerror(errno));
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
}

bool Supervisor::child_alive() {
  if (child_ < 0 || child_reaped_) return false;
  pid_t r = ::waitpid(child_, &child_status_, WNOHANG);
  if (r == child_) child_reaped_ = true;
  return !child_reaped_;
}

void Supervisor::signal_job(int sig) {
  if (child_alive()) ::kill(-child_, sig);
  for (pid_t p : processes_with_env(cat(kEnvToken, "=", token_))) ::kill(p, sig);
}

// SIGCONT (a stopped rank cannot act on SIGTERM), SIGTERM, then SIGKILL after the grace
// period; then every process of this host still carrying the job's token is killed too, and
// the ranks on other hosts are told to stop through their connections.
void Supervisor::stop_job() {
  for (auto& c : conns_) {
    ssize_t n = ::send(c->fd, "stop\n", 5, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
  }
  signal_job(SIGCONT);
  signal_job(SIGTERM);
  double t0 = now_seconds();
  // The grace lets the launcher end its ranks itself; once every rank that was connected has
  // closed its connection (the kernel closes it when the process ends), the ranks are gone and
  // only the launcher is waited for: it gets SIGKILL at once instead of after the whole grace.
  while (child_alive() && now_seconds() - t0 < o_.kill_grace && !all_connections_closed()) {
    read_output(false);
    ::usleep(20000);
  }
  for (int round = 0; round < 250; ++round) {  // 5 s at most
    bool alive = child_alive();
    auto left = processes_with_env(cat(kEnvToken, "=", token_));
    if (!alive && left.empty()) break;
    if (alive) ::kill(-child_, SIGKILL);
    for (pid_t p : left) ::kill(p, SIGKILL);
    read_output(false);
    ::usleep(20000);
  }
  if (child_alive()) say("warning: the launcher (pid ", child_, ") did not end after SIGKILL");
  for (auto& c : conns_) ::close(c->fd);
  conns_.clear();
  read_output(true);
  Json j = Json::object();
  j["event"] = "stopped";  // every process of the job is gone: the restart breakdown's start
  j["attempt"] = attempt_;
  j["stop_seconds"] = now_seconds() - t0;
  events_.write(j);
}

// True when no connection of this attempt is open any more (each has reached end of file);
// false while any is open or before any rank connected.
bool Supervisor::all_connections_closed() {
  bool any = false;
  for (auto& c : conns_) {
    if (c->fd < 0) continue;
    any = true;
    char buf[4096];
    for (;;) {  // what a stopping rank still sent no longer matters: read past it to the end
      ssize_t n = ::recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) break;  // closed (or reset)
      return false;                                                    // still open
    }
  }
  return any || !ranks_.empty();
}

void Supervisor::read_output(bool drain) {
  if (out_fd_ < 0) return;
  const double t0 = now_seconds();
  auto emit = [this](std::string_view line, bool continued) { output_line(line, continued); };
  char buf[65536];
  // A rank that floods its output keeps the pipe full: without a bound on one call the
  // heartbeats, the signals and the launcher's exit would wait for it to pause.
  size_t taken = 0;
  for (;;) {
    ssize_t n = ::read(out_fd_, buf, sizeof buf);
    if (n > 0) {
      out_lines_.feed(std::string_view(buf, size_t(n)), emit);
      std::fflush(stdout);
      taken += size_t(n);
      if (!drain && taken >= (size_t(4) << 20)) return;
      // Draining, a process that escaped may keep writing: the drain is bounded in time too.
      if (drain && now_seconds() - t0 > 5.0) return;
      continue;
    }
    if (n == 0) {  // every writer is gone
      out_lines_.finish(emit);
      std::fflush(stdout);
      ::close(out_fd_);
      out_fd_ = -1;
      return;
    }
    if (errno == EINTR) continue;
    // EAGAIN: nothing now. When draining, a process that escaped may still hold the pipe open:
    // wait a little for EOF, not forever.
    if (!drain || now_seconds() - t0 > 1.0) return;
    ::usleep(10000);
  }
}

void Supervisor::output_line(std::string_view line, bool continued) {
  std::string_view text = line;
  int rank = -1;
  if (continued) {
    rank = out_rank_;  // the rest of a cut line: no tag of its own, and nothing to look for
  } else {
    rank = o_.tagged_output ? untag(line, &text) : -1;
    out_rank_ = rank;
    Cause& oc = output_cause_;
    std::string_view msg;
    int r = -1;
    if (oc.rank < 0 && rank_failed_message(text, &r, &msg)) {
      oc.rank = r;
      oc.text = printable_utf8(msg, 4096);
    } else if (oc.rank < 0 && rank >= 0 && command_error_message(text, &msg)) {
      oc.rank = rank;
      oc.text = printable_utf8(msg, 4096);
    } else if (mpi_named_rank_ < 0 && rank < 0 && mpi_reported_rank(text, &r)) {
      mpi_named_rank_ = r;
    }
  }
  // The bytes as the rank wrote them (binary included), one line each.
  if (rank >= 0)
    std::fprintf(stdout, "[rank %d] ", rank);
  else
    std::fputs(o_.untagged_prefix.c_str(), stdout);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

void Supervisor::accept_all(double now) {
  for (;;) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    int fd =
        ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    char ip[64] = "?";
    ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    c->peer = cat(ip, ":", ntohs(a.sin_port));
    conns_.push_back(std::move(c));
  }
  (void)now;
}

void Supervisor::bad_heartbeat(const Conn& c, const std::string& why) {
  say("warning: ", why);
  Json j = Json::object();
  j["event"] = "bad_heartbeat";
  j["attempt"] = attempt_;
  j["peer"] = c.peer;
  j["rank"] = c.rank;
  j["message"] = why;
  events_.write(j);
}

void Supervisor::read_conn(Conn& c, double now) {
  char buf[4096];
  for (size_t taken = 0; taken < (size_t(1) << 20);) {  // a flooding sender waits its turn
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      taken += size_t(n);
      c.buf.append(buf, size_t(n));
      size_t nl;
      while (c.fd >= 0 && (nl = c.buf.find('\n')) != std::string::npos) {
        std::string line = c.buf.substr(0, nl);
        c.buf.erase(0, nl + 1);
        handle_line(c, line, now);
      }
      if (c.fd >= 0 && c.buf.size() > 4096) {
        bad_heartbeat(c, cat("malformed heartbeat from ",
                             c.rank >= 0 ? cat("rank ", c.rank) : "unknown sender", " (", c.peer,
                             "): a line longer than 4096 bytes; closing the connection"));
        ::close(c.fd);
        c.fd = -1;
      }
      if (c.fd < 0) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    // Closed: a rank that did not say goodbye died (kill -9, a crash, MPI_Abort).
    if (c.rank >= 0) {
      RankState& rs = ranks_[c.rank];
      if (!rs.bye && !rs.lost) {
        rs.lost = true;
        rs.lost_at = now;
      }
    }
    ::close(c.fd);
    c.fd = -1;
    return;
  }
}

void Supervisor::handle_line(Conn& c, const std::string& line, double now) {
  std::string who = c.rank >= 0 ? cat("rank ", c.rank, " (", c.peer, ")")
                                : cat("an unknown sender (", c.peer, ")");
  Message m;
  try {
    m = decode(line, who);
  } catch (const Error& e) {
    if (c.rank >= 0) {  // a known rank: say so and keep listening (silence still counts)
      bad_heartbeat(c, cat(e.what(), " (at step ", ranks_[c.rank].step, "); line ignored"));
    } else {
      bad_heartbeat(c, cat(e.what(), "; closing the connection"));
      ::close(c.fd);
      c.fd = -1;
    }
    return;
  }
  if (c.rank < 0) {
    std::string why;
    if (m.kind != MsgKind::Hello)
      why = "the first line is not a hello";
    else if (m.token != token_)
      why = cat("rank ", m.rank, " (pid ", m.pid, " on ", m.host,
                ") sent a wrong job token: it belongs to another job");
    else if (m.attempt != attempt_)
      why = cat("rank ", m.rank, " (pid ", m.pid, " on ", m.host, ") is from attempt ", m.attempt,
                ", this is attempt ", attempt_, ": a leftover process");
    else if (world_ > 0 && m.world != world_)
      why = cat("rank ", m.rank, " (pid ", m.pid, " on ", m.host, ") says the world has ", m.world,
                " ranks; this job has ", world_);
    else if (world_ > 0 && m.rank >= world_)
      why = cat("unknown rank ", m.rank, " (pid ", m.pid, " on ", m.host, "): this job has ",
                world_, " ranks (0..", world_ - 1, ")");
    else if (ranks_.count(int(m.rank)) && ranks_[int(m.rank)].hello)
      why = cat("a second rank ", m.rank, " (pid ", m.pid, " on ", m.host, ") in attempt ",
                attempt_, " (the first is pid ", ranks_[int(m.rank)].pid, ")");
    if (!why.empty()) {
      bad_heartbeat(c,
                    cat("heartbeat refused from ", c.peer, ": ", why, "; closing the connection"));
      ::close(c.fd);
      c.fd = -1;
      return;
    }
    if (world_ == 0) world_ = int(m.world);
    if (!stragglers_) stragglers_ = std::make_unique<StragglerDetector>(world_, o_.stragglers);
    c.rank = int(m.rank);
    RankState& rs = ranks_[c.rank];
    rs = RankState{};
    rs.hello = true;
    rs.last = now;
    rs.pid = m.pid;
    rs.host = m.host;
    any_hello_ = true;
    events_.set_default_dir(m.run_dir);
    Json j = Json::object();
    j["event"] = "rank_up";
    j["attempt"] = attempt_;
    j["rank"] = m.rank;
    j["pid"] = m.pid;
    j["host"] = m.host;
    // Restart-time breakdown: launch = the launcher's and the process's start (mpirun, MPI
    // init) up to the rank's set-up; setup = the rank's own (model build, restore included).
    if (m.setup_seconds >= 0) {
      j["setup_seconds"] = m.setup_seconds;
      j["launch_seconds"] = std::max(0.0, now - attempt_start_ - m.setup_seconds);
    }
    if (m.restore_seconds >= 0) j["restore_seconds"] = m.restore_seconds;
    events_.write(j);
    return;
  }
  RankState& rs = ranks_[c.rank];
  if (m.kind == MsgKind::Hello) {
    bad_heartbeat(c, cat("malformed heartbeat from ", who, ": a second hello (at step ", rs.step,
                         "); line ignored"));
    return;
  }
  if (m.kind == MsgKind::Bye) {
    rs.bye = true;
    return;
  }
  timeouts_.observe(rs.phase, now - rs.last);
  rs.last = now;
  rs.step = m.step;
  if (m.kind == MsgKind::Section) {
    rs.phase = m.section;
    if (m.step > rs.ended) stragglers_->on_section(c.rank, m.step, m.section, now);
    return;
  }
  rs.phase = "step";
  rs.ended = std::max(rs.ended, m.step);
  if (steps_this_attempt_++ == 0) {
    Json j = Json::object();
    j["event"] = "first_step";
    j["attempt"] = attempt_;
    j["rank"] = c.rank;
    j["step"] = m.step;
    events_.write(j);
  }
  for (const StragglerReport& r : stragglers_->on_step_end(c.rank, m.step, now)) {
    Json j = Json::object();
    const char* kinds[] = {"straggler", "straggler_slow", "straggler_recovered"};
    j["event"] = kinds[r.kind];
    j["attempt"] = attempt_;
    j["rank"] = r.rank;
    j["step"] = r.step;
    j["score"] = r.score;
    j["seconds"] = r.seconds;
    j["median_seconds"] = r.median;
    j["section"] = r.section;
    j["section_score"] = r.section_score;
    events_.write(j);
    char fig[160];
    std::snprintf(fig, sizeof fig, "score %.2f (%.3f s of work per step vs median %.3f s)", r.score,
                  r.seconds, r.median);
    if (r.kind == StragglerReport::Flagged)
      say("straggler: rank ", r.rank, " at step ", r.step, ": ", fig, " below ",
          o_.stragglers.threshold, " for ", o_.stragglers.patience,
          " consecutive steps; slowest section: ", r.section);
    else if (r.kind == StragglerReport::Recovered)
      say("rank ", r.rank, " is no longer a straggler at step ", r.step, ": ", fig);
  }
}

void Supervisor::check_silence(double now) {
  // A rank whose connection closed without a goodbye: dead, unless the launcher ends well
  // within a second (a goodbye lost in a full socket buffer).
  for (auto& [r, rs] : ranks_) {
    if (!rs.lost || now - rs.lost_at <= 1.0) continue;
    if (output_cause_.rank >= 0)  // its own last words say why (an error, then MPI_Abort)
      set_cause(error_cause());
    set_cause({"died", r, rs.step, rs.phase,
               cat("died ", where(rs), ": pid ", rs.pid, " on ", rs.host,
                   " closed its heartbeat connection without a goodbye (killed or crashed)")});
  }
  if (cause_) return;
  bool expect = o_.heartbeats && (o_.expect_heartbeats || any_hello_);
  if (!expect) return;
  // Hung: silent past its phase's timeout. Among several (the others wait in a collective
  // for it), the culprit is a stopped process if one is, else the one silent longest.
  int culprit = -1;
  double silent_max = -1;
  bool culprit_stopped = false;
  std::vector<int> silent;
  for (int r = 0; r < std::max(world_, 1); ++r) {
    auto it = ranks_.find(r);
    if (it == ranks_.end() || !it->second.hello) {
      double s = now - attempt_start_;
      if (s > o_.timeouts.startup) {
        silent.push_back(r);
        if (culprit < 0) {
          culprit = world_ > 0 ? r : -1;
          silent_max = s;
        }
      }
      continue;
    }
    RankState& rs = it->second;
    if (rs.bye || rs.lost) continue;
    double s = now - rs.last;
    if (s <= timeouts_.timeout(rs.phase)) continue;
    silent.push_back(r);
    bool stopped = rs.host == host_ && process_stopped(rs.pid);
    if (culprit < 0 || (stopped && !culprit_stopped) ||
        (stopped == culprit_stopped && s > silent_max)) {
      culprit = r;
      silent_max = s;
      culprit_stopped = stopped;
    }
  }
  if (silent.empty()) return;
  auto it = ranks_.find(culprit);
  if (it == ranks_.end() || !it->second.hello) {
    set_cause({"hung", culprit, 0, "init",
               cat("never said hello: no heartbeat ", silent_max, " s after the launch ",
                   "(--startup-timeout ", o_.timeouts.startup, " s)")});
    return;
  }
  RankState& rs = it->second;
  double limit = timeouts_.timeout(rs.phase);
  double longest = timeouts_.longest(rs.phase);
  std::string how =
      o_.timeouts.fixed > 0 && longest > 0 ? "--hang-timeout"
      : longest > 0 ? cat(o_.timeouts.multiplier, " x the longest ", rs.phase, " seen, ", longest,
                          " s, within [", o_.timeouts.floor, ", ", o_.timeouts.cap, "]")
                    : "--startup-timeout: this phase was never seen to end";
  std::string others;
  for (int r : silent)
    if (r != culprit) others += cat(others.empty() ? "; also silent: rank " : ", ", r);
  char fig[96];
  std::snprintf(fig, sizeof fig, "silent for %.1f s, timeout %.1f s", silent_max, limit);
  set_cause({"hung", culprit, rs.step, rs.phase,
             cat("hung ", where(rs), ": ", fig, " (", how, ")",
                 culprit_stopped ? "; the process is stopped (SIGSTOP?)" : "", others)});
}

std::string Supervisor::describe(const Cause& c) const {
  if (c.rank >= 0) return cat("rank ", c.rank, " failed: ", c.text);
  return c.text;
}

Json Supervisor::cause_json(const Cause& c) const {
  Json j = Json::object();
  j["event"] = c.kind;
  j["attempt"] = attempt_;
  j["rank"] = c.rank;
  j["step"] = c.step;
  j["section"] = c.section;
  j["message"] = describe(c);
  return j;
}

Supervisor::Outcome Supervisor::run_attempt() {
  cause_.reset();
  output_cause_ = Cause{};
  mpi_named_rank_ = -1;
  ranks_.clear();
  steps_this_attempt_ = 0;
  if (stragglers_) stragglers_->reset();
  child_reaped_ = false;
  int fds[2];
  LOOM_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "pipe: ", std::strerror(errno));
  std::vector<std::pair<std::string, std::string>> env = {{kEnvToken, token_}};
  if (o_.heartbeats) {
    std::string host = o_.advertise_host.empty() ? o_.bind_host : o_.advertise_host;
    env.push_back({kEnvAddress, cat(host, ":", port_)});
    env.push_back({kEnvAttempt, std::to_string(attempt_)});
  }
  attempt_start_ = now_seconds();
  Json j = Json::object();
  j["event"] = "start";
  j["attempt"] = attempt_;
  events_.write(j);
  // The child's copy of the write end is made inheritable there (dup2 clears CLOEXEC).
  child_ = spawn_group(o_.command, env, fds[1]);
  ::close(fds[1]);
  out_fd_ = fds[0];
  ::fcntl(out_fd_, F_SETFL, O_NONBLOCK);

  for (;;) {
    std::vector<pollfd> p;
    p.push_back({g_signal_pipe[0], POLLIN, 0});
    p.push_back({listen_fd_, POLLIN, 0});
    if (out_fd_ >= 0) p.push_back({out_fd_, POLLIN, 0});
    for (auto& c : conns_) p.push_back({c->fd, POLLIN, 0});
    ::poll(p.data(), p.size(), 100);
    double now = now_seconds();
    char sig;
    if (::read(g_signal_pipe[0], &sig, 1) == 1) {
      signal_ = sig;
      say(strsignal(sig), " received: stopping every rank");
      Json e = Json::object();
      e["event"] = "signal";
      e["attempt"] = attempt_;
      e["signal"] = int(sig);
      events_.write(e);
      stop_job();
      return Outcome::Signalled;
    }
    accept_all(now);
    for (auto& c : conns_) read_conn(*c, now);
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                [](const std::unique_ptr<Conn>& c) { return c->fd < 0; }),
                 conns_.end());
    read_output(false);
    if (!child_alive()) {
      read_output(true);  // what the ranks said last names the failure
      int code =
          WIFEXITED(child_status_) ? WEXITSTATUS(child_status_) : 128 + WTERMSIG(child_status_);
      if (code == 0 && !cause_) {
        stop_job();  // nothing should be left; make sure
        return Outcome::Success;
      }
      // A rank's own error message beats "connection closed": it says why.
      if (output_cause_.rank >= 0) set_cause(error_cause());
      for (auto& [r, rs] : ranks_)
        if (rs.lost) rs.lost_at = -1e9;  // decide now
      check_silence(now);
      if (mpi_named_rank_ >= 0)
        set_cause({"exit", mpi_named_rank_, 0, "", cat("the launcher exited with code ", code)});
      set_cause({"exit", -1, 0, "", cat("the launcher exited with code ", code)});
      stop_job();
      return Outcome::Failed;
    }
    check_silence(now);
    if (cause_) {
      say(describe(*cause_), "; stopping every rank");
      stop_job();
      return Outcome::Failed;
    }
  }
}

int Supervisor::run() {
  if (o_.heartbeats) listen_socket();
  LOOM_CHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "pipe: ", std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  double backoff = o_.backoff;
  for (attempt_ = 0;; ++attempt_) {
    Outcome out = run_attempt();
    if (out == Outcome::Success) {
      Json j = Json::object();
      j["event"] = "done";
      j["attempt"] = attempt_;
      events_.write(j);
      if (attempt_ > 0) say("the job completed after ", attempt_, " restart(s)");
      return 0;
    }
    if (out == Outcome::Signalled) return 128 + signal_;
    const Cause& c = *cause_;
    events_.write(cause_json(c));
    std::string what = describe(c);
    // An error before any step of this attempt (a bad config, missing data, a refused
    // checkpoint) would fail the same way again: not retried.
    bool hopeless = c.kind == "error" && steps_this_attempt_ == 0;
    if (attempt_ >= o_.max_restarts || hopeless) {
      Json j = Json::object();
      j["event"] = "gave_up";
      j["attempt"] = attempt_;
      j["restarts"] = attempt_;
      j["message"] = what;
      events_.write(j);
      std::string why = hopeless && attempt_ < o_.max_restarts
                            ? " (an error before the first step: a restart would fail the same "
                              "way)"
                        : o_.max_restarts == 0
                            ? " (--max-restarts 0: pass --max-restarts N to restart it)"
                            : cat(" (giving up after ", attempt_, " restart(s), --max-restarts ",
                                  o_.max_restarts, ")");
      say(what, "; the job", world_ > 0 ? cat(" of ", world_, " ranks") : "", " was stopped", why);
      return 1;
    }
    // An attempt that trained (a step ended) is no crash loop: its restart starts at once and
    // the back-off starts over; attempts that fail before their first step wait, doubling.
    const bool progressed = steps_this_attempt_ > 0;
    if (progressed) backoff = o_.backoff;
    const double wait = progressed ? 0.0 : backoff;
    say(what, "; restart ", attempt_ + 1, " of ", o_.max_restarts, " in ", wait, " s");
    Json j = Json::object();
    j["event"] = "restart";
    j["attempt"] = attempt_ + 1;
    j["backoff_seconds"] = wait;
    j["cause"] = what;
    events_.write(j);
    pollfd p{g_signal_pipe[0], POLLIN, 0};
    if (::poll(&p, 1, int(wait * 1000)) > 0) {
      char sig = 0;
      if (::read(g_signal_pipe[0], &sig, 1) == 1) {
        say(strsignal(sig), " received during the back-off: not restarting");
        return 128 + sig;
      }
    }
    if (!progressed) backoff = std::min(o_.backoff_max, std::max(backoff * 2, 0.0));
  }
}

}  // namespace

int supervise(const SupervisorOptions& o) {
  o.validate();
  Supervisor s(o);
  return s.run();
}

}  // namespace loom::resil
