// `loom serve` at its edges: output that is valid UTF-8 whatever bytes the model writes, slow
// clients, defaults that fit the context, logit_bias, usage over several prompts, bodies of any
// Content-Type, streams cut by a shutdown, /health while draining, exact /metrics counters.
#include <poll.h>

#include "core/utf8.h"
#include "serve/server_fixture.h"

using namespace loom;
using namespace loom::serve_test;

namespace {

bool valid_utf8(const std::string& s) {
  return utf8_lossy(s) == s;
}

const std::string kFffd = "\xEF\xBF\xBD";

// 'a', then 漢 and 字 a byte per token, then the first byte of another 漢 cut off by max_tokens.
std::vector<int32_t> split_characters_script() {
  return {'a', 0xE6, 0xBC, 0xA2, 0xE5, 0xAD, 0x97, 0xE6};
}

}  // namespace

TEST_F(Fixture, OutputIsValidUtf8WhereTokensSplitCharacters) {
  script = std::make_unique<ScriptRunner>(split_characters_script(), 3);
  num_blocks = 64;
  start();
  const std::string want = "a\xE6\xBC\xA2\xE5\xAD\x97" + kFffd;  // "a漢字" and U+FFFD
  // Whole: the cut character is U+FFFD; each token's logprob entry is valid text, its bytes the
  // token's own.
  std::string raw;
  const std::string body = R"({"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0,
                               "logprobs": 1})";
  ASSERT_EQ(raw_http(port, "/v1/completions", body, false, &raw), 200) << raw;
  EXPECT_TRUE(valid_utf8(raw));
  auto [s, j] = post("/v1/completions", body);
  ASSERT_EQ(s, 200);
  const Json& ch = j.at("choices").as_array()[0];
  EXPECT_EQ(ch.at("text").as_string(), want);
  EXPECT_EQ(ch.at("logprobs").at("tokens").as_array()[1].as_string(), kFffd);
  auto [sc, jc] = post("/v1/chat/completions",
                       R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                           "temperature": 0, "logprobs": true})");
  ASSERT_EQ(sc, 200) << jc.dump();

  // Streamed: an incomplete character waits for its last byte; what never completes ends the
  // stream as U+FFFD. No delta holds a replacement for a character that did complete.
  auto r = client().Post("/v1/completions",
                         R"({"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0,
                             "stream": true})",
                         "application/json");
  ASSERT_TRUE(r);
  EXPECT_TRUE(valid_utf8(r->body));
  std::string text;
  std::vector<std::string> deltas;
  for (const std::string& e : sse_events(r->body)) {
    if (e == "[DONE]") continue;
    const std::string d = Json::parse(e).at("choices").as_array()[0].at("text").as_string();
    if (!d.empty()) deltas.push_back(d);
    text += d;
  }
  EXPECT_EQ(text, want);
  ASSERT_GE(deltas.size(), 3u);
  for (size_t i = 0; i + 1 < deltas.size(); ++i)
    EXPECT_EQ(deltas[i].find(kFffd), std::string::npos) << i << ": " << deltas[i];
  EXPECT_EQ(deltas.back(), kFffd);

  // /detokenize of bytes that are no text, and echo of a prompt holding \xff\xfe.
  ASSERT_EQ(raw_http(port, "/detokenize", R"({"tokens": [200, 201, 255]})", false, &raw), 200);
  EXPECT_TRUE(valid_utf8(raw));
  auto [sd, d] = post("/detokenize", R"({"tokens": [200, 201, 255]})");
  EXPECT_EQ(d.at("prompt").as_string(), kFffd + kFffd + kFffd);
  auto [se, e] = post("/v1/completions", R"({"prompt": [104, 255, 254], "max_tokens": 1,
                                             "echo": true, "temperature": 0})");
  ASSERT_EQ(se, 200) << e.dump();
  EXPECT_EQ(e.at("choices").as_array()[0].at("text").as_string(), "h" + kFffd + kFffd + "a");
}

// Slow clients (a partial request, then a byte at a time) are cut at the whole-request deadline
// however often they send, and meanwhile /health answers everyone else at once.
TEST_F(Fixture, SlowClientsAreCutAndDelayNoOne) {
  options.read_timeout_seconds = 1;
  start();
  std::vector<int> slow;
  for (int i = 0; i < 70; ++i) {
    const int fd = connect_to(port);
    ASSERT_GE(fd, 0);
    const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
    ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), ssize_t(head.size()));
    slow.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  double worst = 0;
  // 3 s of a byte per client every 100 ms: a deadline per read would never end them.
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
    for (int fd : slow) ::send(fd, "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    const auto h0 = std::chrono::steady_clock::now();
    auto h = client().Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    worst = std::max(worst,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_LT(worst, 1.0);
  int cut = 0;
  for (int fd : slow) {
    char b;
    const ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ++cut;
    ::close(fd);
  }
  EXPECT_EQ(cut, 70);
}

// Without max_tokens a request gets the context its prompt leaves (as vLLM), not a fixed
// default that a short-context model cannot take.
TEST_F(Fixture, MissingMaxTokensTakesTheContextLeft) {
  start();
  auto [s, j] = post("/v1/chat/completions",
                     R"({"messages": [{"role": "user", "content": "hello"}], "ignore_eos": true,
                         "temperature": 0})");
  ASSERT_EQ(s, 200) << j.dump();
  const Json& u = j.at("usage");
  EXPECT_EQ(u.at("prompt_tokens").as_int() + u.at("completion_tokens").as_int(), 256);
  EXPECT_EQ(j.at("choices").as_array()[0].at("finish_reason").as_string(), "length");
  auto [s2, j2] = post("/v1/completions", R"({"prompt": [1, 2, 3], "ignore_eos": true})");
  ASSERT_EQ(s2, 200) << j2.dump();
  EXPECT_EQ(j2.at("usage").at("completion_tokens").as_int(), 253);
}

// logit_bias is honoured (a +100 bias makes greedy output that token); malformed maps, values
// out of range, ids outside the vocabulary and fields Loom does not honour are 400s.
TEST_F(Fixture, LogitBiasIsHonouredAndMalformedValuesRefused) {
  start();
  auto [s, j] = post("/v1/completions", R"({"prompt": "hi", "max_tokens": 4, "temperature": 0,
                                            "logit_bias": {"65": 100}})");
  ASSERT_EQ(s, 200) << j.dump();
  EXPECT_EQ(j.at("choices").as_array()[0].at("text").as_string(), "AAAA");
  for (const char* bias : {R"({"abc": "zzz"})", "[1, 2]", R"({"65": "x"})", R"({"65": 500})",
                           R"({"-1": 1})", R"({"99999": 1})", "3"}) {
    auto [sb, jb] =
        post("/v1/completions",
             std::string(R"({"prompt": "hi", "max_tokens": 1, "logit_bias": )") + bias + "}");
    EXPECT_EQ(sb, 400) << bias;
    EXPECT_NE(jb.at("error").at("message").as_string().find("logit_bias"), std::string::npos)
        << jb.dump();
  }
  // Refused: fields Loom does not honour, and tools on a completion (they are for chat);
  // response_format and guided_json / _regex / _choice are honoured (structured_serve_test.cpp).
  for (const char* field : {R"("tools": [])", R"("tool_choice": "required")", R"("functions": [])",
                            R"("function_call": "auto")", R"("guided_grammar": "x")",
                            R"("suffix": "x")", R"("prediction": {})"}) {
    auto [sf, jf] =
        post("/v1/completions", std::string(R"({"prompt": "hi", "max_tokens": 1, )") + field + "}");
    EXPECT_EQ(sf, 400) << field;
  }
}

// usage.prompt_tokens of a list of prompts is their sum (each once, whatever n is).
TEST_F(Fixture, UsageSumsEveryPrompt) {
  start();
  for (int n : {1, 2}) {
    auto [s, j] = post("/v1/completions",
                       R"({"prompt": ["the cat", "a dog", "my fish"], "max_tokens": 1, "n": )" +
                           std::to_string(n) + "}");
    ASSERT_EQ(s, 200) << j.dump();
    EXPECT_EQ(j.at("usage").at("prompt_tokens").as_int(), 7 + 5 + 7) << n;
    EXPECT_EQ(j.at("choices").size(), size_t(3 * n));
  }
}

// A body is read as JSON whatever its Content-Type (curl -d sends a form type), and curl's
// "Expect: 100-continue" is answered at once; 413 is for bodies past the limit only.
TEST_F(Fixture, BodiesOfAnyContentTypeAreReadAsJson) {
  start();
  const std::string body =
      R"({"prompt": "x", "max_tokens": 1, "user": ")" + std::string(10000, 'u') + R"("})";
  auto r = client().Post("/v1/completions", body, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), ssize_t(head.size()));
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);  // long before curl's own 1 s wait would matter
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, size_t(n)).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u);
  ASSERT_EQ(::send(fd, body.data(), body.size(), MSG_NOSIGNAL), ssize_t(body.size()));
  std::string resp;
  ssize_t k;
  while ((k = ::recv(fd, buf, sizeof buf, 0)) > 0) resp.append(buf, size_t(k));
  ::close(fd);
  EXPECT_EQ(resp.rfind("HTTP/1.1 200", 0), 0u) << resp;
}

// Shutting down: /health says draining (503), new requests get 503, and streams the engine cuts
// end with an error event: never a [DONE] that looks complete.
TEST_F(Fixture, DrainingSaysSoAndCutStreamsEndWithAnError) {
  step_delay_ms = 20;
  start();
  constexpr int kStreams = 6;
  std::vector<std::string> bodies(kStreams);
  std::vector<std::thread> streams;
  for (int i = 0; i < kStreams; ++i)
    streams.emplace_back([&, i] {
      raw_http(port, "/v1/completions",
               R"({"prompt": "s)" + std::to_string(i) +
                   R"(", "max_tokens": 200, "ignore_eos": true, "stream": true})",
               false, &bodies[size_t(i)]);
    });
  for (int k = 0; k < 250 && engine->stats().requests_running < kStreams; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  server->set_draining();
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(Json::parse(h->body).at("status").as_string(), "draining");
  auto [s, j] = post("/v1/completions", R"({"prompt": "late", "max_tokens": 1})");
  EXPECT_EQ(s, 503) << j.dump();
  engine->stop(0);  // the drain deadline: what runs is cancelled
  for (auto& t : streams) t.join();
  for (const std::string& b : bodies) {
    bool finished = false, error = false;
    for (const std::string& e : sse_events(b)) {
      if (e == "[DONE]") continue;
      const Json ev = Json::parse(e);
      if (ev.contains("error")) error = true;
      if (ev.contains("choices") && ev.at("choices").size() > 0 &&
          !ev.at("choices").as_array()[0].at("finish_reason").is_null())
        finished = true;
    }
    EXPECT_TRUE(finished || error) << b.substr(b.size() > 400 ? b.size() - 400 : 0);
  }
}

namespace {

// An engine whose counters are past 10^6 (and past what a float holds exactly).
struct CountingEngine : infer::Engine {
  int64_t submit(std::vector<int32_t>, const infer::SamplingParams&,
                 std::function<void(const infer::TokenEvent&)>) override {
    throw infer::RequestRejected{503, "never"};
  }
  void cancel(int64_t) override {}
  infer::EngineStats stats() const override {
    infer::EngineStats s;
    s.prompt_tokens_total = 12345678901;
    s.generation_tokens_total = 1000001;
    s.cached_tokens_total = 16777217;
    s.kv_blocks_total = 3;
    s.kv_blocks_used = 1;
    s.kv_block_size = 16;
    s.kv_cache_dtype = "fp8";
    return s;
  }
};

}  // namespace

TEST(ServerMetrics, CountersArePrintedExactly) {
  CountingEngine engine;
  serve::ServerOptions so;
  so.port = 0;
  serve::Server server(engine, nullptr, nullptr, so);
  const int port = server.bind();
  std::thread io([&] { server.run(); });
  httplib::Client c("127.0.0.1", port);
  auto m = c.Get("/metrics");
  server.stop();
  io.join();
  ASSERT_TRUE(m);
  for (const char* line :
       {"loom:prompt_tokens_total 12345678901\n", "loom:generation_tokens_total 1000001\n",
        "loom:prompt_tokens_cached_total 16777217\n",
        "loom:kv_cache_usage_perc 0.3333333333333333\n",
        "loom:cache_config_info{block_size=\"16\",cache_dtype=\"fp8\",num_blocks=\"3\"} 1\n"})
    EXPECT_NE(m->body.find(line), std::string::npos) << line << m->body;
}
