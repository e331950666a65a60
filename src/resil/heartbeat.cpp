#include "resil/heartbeat.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "resil/protocol.h"

namespace loom::resil {

const char* section_name(Section s) {
  switch (s) {
    case Section::Data:
      return "data";
    case Section::ForwardBackward:
      return "forward_backward";
    case Section::Optimizer:
      return "optimizer";
    case Section::Checkpoint:
      return "checkpoint";
    case Section::Eval:
      return "eval";
  }
  return "unknown";
}

class HeartbeatClient {
 public:
  HeartbeatClient(int fd, int rank) : fd_(fd), rank_(rank) {}

  // Does not block training: a full socket buffer (a stopped supervisor) drops the line, and
  // the supervisor then sees silence, which is what it is. A line partly sent is finished
  // (waiting at most a second), so the stream never holds half a line followed by the next.
  void send_line(const Message& m) {
    std::string line = encode(m) + "\n";
    ssize_t n = ::send(fd_, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0 || size_t(n) == line.size()) return;
    size_t done = size_t(n);
    double deadline = now_seconds() + 1.0;
    while (done < line.size() && now_seconds() < deadline) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      n = ::send(fd_, line.data() + done, line.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0)
        done += size_t(n);
      else if (n < 0 && errno != EAGAIN && errno != EINTR)
        return;
    }
  }

  // Reads what the supervisor says; "stop" or a closed connection ends the process: the job is
  // being stopped, and a rank left running would be an orphan holding its cores (and, on a
  // GPU machine, its device).
  void watch() {
    char buf[256];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      const char* why = n > 0 ? "the supervisor stopped the job" : "the supervisor is gone";
      std::fprintf(stderr, "loom: rank %d: %s; exiting\n", rank_, why);
      std::fflush(stderr);
      ::_exit(143);
    }
  }

  int rank() const { return rank_; }
  int slow_rank = -1;  // LOOM_SLOW_RANK: the straggler tests' hook
  int slow_ms = 0;

 private:
  int fd_;
  int rank_;
};

namespace detail {
HeartbeatClient* g_client = nullptr;

namespace {
double g_step_start = -1;  // when this step's data section began
}

void section(Section s, int64_t step) {
  HeartbeatClient& c = *g_client;
  Message m;
  m.kind = MsgKind::Section;
  m.step = step;
  m.section = section_name(s);
  c.send_line(m);
  if (s == Section::Data) g_step_start = now_seconds();
  if (s == Section::Data && c.slow_rank == c.rank())  // a slow input pipeline on one rank
    std::this_thread::sleep_for(std::chrono::milliseconds(c.slow_ms));
}

void step_done(int64_t step) {
  Message m;
  m.kind = MsgKind::Step;
  m.step = step;
  m.seconds = g_step_start >= 0 ? now_seconds() - g_step_start : 0;
  g_client->send_line(m);
}
}  // namespace detail

namespace {

void say_bye() {
  if (!detail::g_client) return;
  Message m;
  m.kind = MsgKind::Bye;
  detail::g_client->send_line(m);
}

int connect_to(const std::string& address) {
  size_t colon = address.rfind(':');
  LOOM_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size(), kEnvAddress,
             "='", address, "' is not host:port");
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  LOOM_CHECK(rc == 0, kEnvAddress, "='", address, "': cannot resolve: ", gai_strerror(rc));
  int fd = -1;
  std::string err = "no address";
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  LOOM_CHECK(fd >= 0, kEnvAddress, "='", address, "': cannot connect to the supervisor: ", err);
  return fd;
}

}  // namespace

void heartbeat_start(int rank, int world, const std::string& run_dir, double setup_seconds,
                     double restore_seconds) {
  const char* address = std::getenv(kEnvAddress);
  if (detail::g_client || !address || !*address) return;
  const char* token = std::getenv(kEnvToken);
  const char* attempt = std::getenv(kEnvAttempt);
  int fd = connect_to(address);
  auto* c = new HeartbeatClient(fd, rank);  // lives until the process ends (the thread uses it)
  if (const char* slow = std::getenv("LOOM_SLOW_RANK")) {
    LOOM_CHECK(std::sscanf(slow, "%d:%d", &c->slow_rank, &c->slow_ms) == 2 && c->slow_ms >= 0,
               "LOOM_SLOW_RANK='", slow, "' is not <rank>:<milliseconds>");
  }
  Message hello;
  hello.kind = MsgKind::Hello;
  hello.token = token ? token : "";
  hello.attempt = attempt ? std::atoll(attempt) : 0;
  hello.rank = rank;
  hello.world = world;
  hello.pid = ::getpid();
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  hello.host = host;
  hello.run_dir = run_dir;
  hello.setup_seconds = setup_seconds;
  hello.restore_seconds = restore_seconds;
  c->send_line(hello);
  detail::g_client = c;
  std::thread([c] { c->watch(); }).detach();
  std::atexit(say_bye);
}

}  // namespace loom::resil
