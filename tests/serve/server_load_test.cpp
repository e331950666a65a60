// `loom serve` under a thousand clients at once (loopback, bounded in time): every streaming
// client is answered in full while slowloris clients hold connections open, no KV block stays
// in use afterwards, and past the queue's limit clients get a clean 429.
#include <poll.h>

#include "serve/server_fixture.h"

using namespace loom;
using namespace loom::serve_test;

namespace {

// Runs every request on its own non-blocking connection at once, from this one thread, until
// each server closes its connection or `seconds` pass. Returns the raw responses ("" for a
// connection that failed).
std::vector<std::string> run_at_once(int port, const std::vector<std::string>& requests,
                                     double seconds) {
  struct Conn {
    int fd = -1;
    size_t sent = 0;
    std::string in;
    bool open = false;
  };
  std::vector<Conn> cs(requests.size());
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i].fd = connect_to(port);
    if (cs[i].fd < 0) continue;
    fcntl(cs[i].fd, F_SETFL, fcntl(cs[i].fd, F_GETFL) | O_NONBLOCK);
    cs[i].open = true;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<pollfd> ps;
  std::vector<size_t> who;
  while (std::chrono::steady_clock::now() < until) {
    ps.clear();
    who.clear();
    for (size_t i = 0; i < cs.size(); ++i)
      if (cs[i].open) {
        const short want = cs[i].sent < requests[i].size() ? POLLOUT : POLLIN;
        ps.push_back({cs[i].fd, want, 0});
        who.push_back(i);
      }
    if (ps.empty()) break;
    if (::poll(ps.data(), ps.size(), 100) <= 0) continue;
    for (size_t k = 0; k < ps.size(); ++k) {
      Conn& c = cs[who[k]];
      if (ps[k].revents & POLLOUT) {
        const std::string& r = requests[who[k]];
        const ssize_t n = ::send(c.fd, r.data() + c.sent, r.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) c.sent += size_t(n);
      } else if (ps[k].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[8192];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) {
          c.in.append(buf, size_t(n));
        } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
          ::close(c.fd);
          c.open = false;
        }
      }
    }
  }
  std::vector<std::string> out;
  for (Conn& c : cs) {
    if (c.open) ::close(c.fd);
    out.push_back(c.in);
  }
  return out;
}

// Connections that send a request head a byte at a time, never finishing it.
struct Slowloris {
  std::vector<int> fds;
  std::atomic<bool> stop{false};
  std::thread t;
  Slowloris(int port, int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = connect_to(port);
      if (fd < 0) continue;
      const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
      ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
      fds.push_back(fd);
    }
    t = std::thread([this] {
      while (!stop) {
        for (int fd : fds) ::send(fd, "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  ~Slowloris() {
    stop = true;
    t.join();
    for (int fd : fds) ::close(fd);
  }
};

std::string stream_request(int i) {
  return post_request("/v1/completions",
                      R"({"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0, "stream": true,
                          "user": "c)" +
                          std::to_string(i) + "\"}");
}

}  // namespace

TEST_F(Fixture, AThousandStreamingClientsAreAllAnsweredInFull) {
  script = std::make_unique<ScriptRunner>(bytes("hello wo"), 3);
  num_blocks = 1024;
  max_num_seqs = 256;
  start(/*max_queue=*/4096);
  Slowloris slow(port, 100);  // open for the whole run: the server's deadline is 30 s
  ASSERT_EQ(slow.fds.size(), 100u);
  constexpr int kClients = 1000;
  std::vector<std::string> reqs;
  for (int i = 0; i < kClients; ++i) reqs.push_back(stream_request(i));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> got = run_at_once(port, reqs, 120);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int full = 0;
  for (const std::string& r : got) {
    std::string text, finish;
    bool done = false;
    for (const std::string& e : sse_events(r)) {
      if (e == "[DONE]") {
        done = true;
        continue;
      }
      const Json c = Json::parse(e).at("choices").as_array()[0];
      text += c.at("text").as_string();
      if (!c.at("finish_reason").is_null()) finish = c.at("finish_reason").as_string();
    }
    if (r.rfind("HTTP/1.1 200", 0) == 0 && done && finish == "length" && text == "hello wo") ++full;
  }
  EXPECT_EQ(full, kClients) << "in " << took << " s";
  // Every sequence has left and freed its blocks (the counts settle at a step boundary).
  bool idle = false;
  for (int i = 0; i < 500 && !idle; ++i) {
    const infer::EngineStats s = engine->stats();
    idle = s.requests_running == 0 && s.requests_waiting == 0 && engine->cache().num_used() == 0;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(idle) << "blocks in use: " << engine->cache().num_used();
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("loom:request_total{outcome=\"success\"} 1000\n"), std::string::npos)
      << m->body;
}

// Past the queue's limit a client gets a whole 429 (OpenAI's error, Retry-After) at once, while
// those queued wait their turn; none is lost.
TEST_F(Fixture, PastMaxQueueClientsGetAClean429) {
  script = std::make_unique<ScriptRunner>(bytes("hello wo"), 3);
  num_blocks = 256;
  start(/*max_queue=*/50, /*run_engine=*/false, /*timeout=*/3);
  std::vector<std::string> reqs;
  for (int i = 0; i < 60; ++i) reqs.push_back(stream_request(i));
  const std::vector<std::string> got = run_at_once(port, reqs, 30);
  int limited = 0, timed_out = 0;
  for (const std::string& r : got) {
    if (r.rfind("HTTP/1.1 429", 0) == 0) {
      const size_t body = r.find("\r\n\r\n");
      ASSERT_NE(body, std::string::npos);
      EXPECT_NE(r.find("Retry-After: 1\r\n"), std::string::npos) << r;
      EXPECT_EQ(Json::parse(r.substr(body + 4)).at("error").at("type").as_string(),
                "rate_limit_error");
      ++limited;
    } else if (r.rfind("HTTP/1.1 200", 0) == 0 && r.find("timed out") != std::string::npos) {
      ++timed_out;  // queued, never run: the request's own deadline ended it
    }
  }
  EXPECT_EQ(limited, 10);
  EXPECT_EQ(timed_out, 50);
}
