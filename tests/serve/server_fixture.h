// `loom serve` over loopback for the serve tests: the real engine behind a Server on a free
// port, with a tiny model (or a runner that writes a fixed script of tokens), and raw-socket
// clients for what an HTTP client library would hide (hang-ups, slow or partial requests).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/json.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "model/decoder.h"
#include "serve/server.h"

namespace loom::serve_test {

// The real runner, slowed down: a request then takes long enough that a test sees whether it
// was cancelled or ran to its end.
struct SlowRunner : infer::ModelRunner {
  infer::ModelRunner& inner;
  int delay_ms;
  SlowRunner(infer::ModelRunner& r, int ms) : inner(r), delay_ms(ms) {}
  int vocab() const override { return inner.vocab(); }
  int max_seq() const override { return inner.max_seq(); }
  infer::KvSpec kv_spec() const override { return inner.kv_spec(); }
  void forward(const std::vector<infer::SeqChunk>& batch, const infer::KvCacheView& cache,
               float* logits) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    inner.forward(batch, cache, logits);
  }
};

// A model that writes `script` after any prompt of `prompt_len` tokens (greedy: the scripted
// token's logit stands far above the rest), then repeats its last token. No arithmetic: a
// thousand streams cost little more than their HTTP.
struct ScriptRunner : infer::ModelRunner {
  std::vector<int32_t> script;
  int prompt_len;
  ScriptRunner(std::vector<int32_t> s, int plen) : script(std::move(s)), prompt_len(plen) {}
  int vocab() const override { return 260; }
  int max_seq() const override { return 256; }
  infer::KvSpec kv_spec() const override { return {1, 1, 4, DType::F32}; }
  void forward(const std::vector<infer::SeqChunk>& batch, const infer::KvCacheView&,
               float* logits) override {
    for (const infer::SeqChunk& c : batch) {
      if (!c.want_logits) continue;
      std::fill(logits, logits + vocab(), 0.f);
      const size_t k = size_t(std::max(0, c.start_pos + c.n - prompt_len));
      logits[script[std::min(k, script.size() - 1)]] = 50.f;
      logits += vocab();
    }
  }
};

// A connected loopback socket (-1 when connecting failed).
inline int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline std::string post_request(const std::string& path, const std::string& body,
                                const std::string& content_type = "application/json") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + content_type +
         "\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body;
}

// A raw HTTP/1.1 exchange on its own socket: the request is sent, then the whole response read
// (until the server closes: "Connection: close"), or the socket is closed at once (hang_up).
// Returns the status line's code, 0 when no response came; the response in *raw if given.
inline int raw_http(int port, const std::string& path, const std::string& body,
                    bool hang_up = false, std::string* raw = nullptr) {
  const int fd = connect_to(port);
  if (fd < 0) return 0;
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = post_request(path, body);
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != ssize_t(req.size()) || hang_up) {
    ::close(fd);
    return 0;
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) resp.append(buf, size_t(n));
  ::close(fd);
  if (raw) *raw = resp;
  if (resp.rfind("HTTP/1.1 ", 0) != 0 || resp.size() < 12) return 0;
  return std::atoi(resp.c_str() + 9);
}

// The "data: ..." payloads of a server-sent-event body, in order.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

struct Fixture : testing::Test {
  data::BpeTokenizer tok = data::byte_chatml_tokenizer();
  std::unique_ptr<data::ChatTemplate> chat;
  std::unique_ptr<Decoder> model;
  std::unique_ptr<infer::DecoderRunner> runner;
  std::unique_ptr<SlowRunner> slow;
  std::unique_ptr<ScriptRunner> script;  // set before start(): serves it instead of the model
  int step_delay_ms = 0;                 // > 0: every engine step takes at least this long
  size_t max_body_bytes = 0;             // > 0: the server's request body limit
  serve::ServerOptions options;          // start() sets port, model name, context, timeout
  int max_num_seqs = 64;
  int num_blocks = 0;                    // > 0: the KV pool's size in blocks
  infer::SpeculativeConfig speculative;  // the engine's speculative decoding (off by default)
  std::unique_ptr<infer::LoomEngine> engine;
  std::unique_ptr<serve::Server> server;
  std::thread http;
  int port = 0;

  // run_engine false: requests queue up and are never run (queue limits, timeouts).
  void start(int max_queue = 64, bool run_engine = true, double timeout = 600) {
    ModelConfig c = model_preset("tiny-llama");
    c.n_layer = 2, c.d_model = 32, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 8, c.d_ff = 64;
    c.vocab = 260, c.max_seq = 256, c.init_std = 0.3f;
    model = std::make_unique<Decoder>(c, cpu_backend());
    model->params().init(1);
    chat = std::make_unique<data::ChatTemplate>("chatml", tok);
    runner = std::make_unique<infer::DecoderRunner>(*model);
    infer::EngineConfig ec;
    ec.max_queue = max_queue;
    ec.scheduler.max_num_seqs = max_num_seqs;
    ec.num_blocks = num_blocks;
    ec.speculative = speculative;
    ec.detokenize = [this](const std::vector<int32_t>& ids) {
      std::string s;
      for (int32_t t : ids)
        if (t < tok.vocab_size()) tok.decode_append(t, s);
      return s;
    };
    infer::ModelRunner* r = runner.get();
    if (script) r = script.get();
    if (step_delay_ms > 0) r = (slow = std::make_unique<SlowRunner>(*r, step_delay_ms)).get();
    engine = std::make_unique<infer::LoomEngine>(*r, ec);
    if (run_engine) engine->start();
    serve::ServerOptions so = options;
    so.request_timeout_seconds = timeout;
    so.port = 0;
    so.model_name = "tiny";
    so.max_seq = c.max_seq;
    if (max_body_bytes > 0) so.max_body_bytes = max_body_bytes;
    server = std::make_unique<serve::Server>(*engine, &tok, chat.get(), so);
    port = server->bind();
    http = std::thread([this] { server->run(); });
    server->set_ready(true);
  }
  void TearDown() override {
    if (engine) engine->stop(0);
    if (server) server->stop();
    if (http.joinable()) http.join();
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    return c;
  }
  std::pair<int, Json> post(const std::string& path, const std::string& body) {
    auto r = client().Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return {0, Json()};
    return {r->status, Json::parse(r->body)};
  }
  // The no-cache greedy continuation's text, for checking what the API returns.
  std::string greedy_text(const std::vector<int32_t>& prompt, int n) {
    std::vector<int32_t> p = prompt;
    SamplingOptions o;
    o.temperature = 0;
    generate(*model, p, n, o);
    std::vector<int32_t> out(p.begin() + long(prompt.size()), p.end());
    std::string s;
    for (int32_t t : out) {
      if (t == 256 || t == 258) break;  // end of text / end of turn
      if (t < tok.vocab_size()) s += tok.decode(std::vector<int32_t>{t});
    }
    return s;
  }
};

inline std::vector<int32_t> bytes(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

}  // namespace loom::serve_test
