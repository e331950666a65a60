// `loom serve`'s HTTP API over loopback with the real engine and a tiny model: response shapes
// as OpenAI defines them, errors and their statuses, streaming with [DONE] and usage, a client
// that disconnects cancels its request, /health answers while busy, tokenize round trips.
#include "core/utf8.h"
#include "serve/server_fixture.h"

using namespace loom;
using namespace loom::serve_test;

TEST_F(Fixture, CompletionsAndChatHaveOpenAIsShapes) {
  start();
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto [ms, models] = post("/v1/models", "{}");
  EXPECT_EQ(ms, 404);  // GET only
  auto g = client().Get("/v1/models");
  ASSERT_TRUE(g);
  EXPECT_EQ(Json::parse(g->body).at("data").as_array()[0].at("id").as_string(), "tiny");

  auto [s1, c] = post("/v1/completions",
                      R"({"model": "tiny", "prompt": "hello", "max_tokens": 6, "temperature": 0,
                          "n": 2, "logprobs": 2})");
  ASSERT_EQ(s1, 200) << c.dump();
  EXPECT_EQ(c.at("object").as_string(), "text_completion");
  ASSERT_EQ(c.at("choices").size(), 2u);
  const Json& ch = c.at("choices").as_array()[0];
  // The random model's bytes are no UTF-8: the API writes them as the lossy decode does.
  EXPECT_EQ(ch.at("text").as_string(), utf8_lossy(greedy_text(bytes("hello"), 6)));
  EXPECT_EQ(c.at("choices").as_array()[1].at("text").as_string(), ch.at("text").as_string());
  EXPECT_EQ(ch.at("logprobs").at("top_logprobs").size(), ch.at("logprobs").at("tokens").size());
  EXPECT_EQ(c.at("usage").at("prompt_tokens").as_int(), 5);
  EXPECT_EQ(c.at("usage").at("total_tokens").as_int(),
            5 + c.at("usage").at("completion_tokens").as_int());

  const std::string chat_body =
      R"({"messages": [{"role": "system", "content": "be brief"},
                       {"role": "user", "content": [{"type": "text", "text": "hi there, how are you today?"}]}],
          "max_completion_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 1})";
  auto [s2, cc] = post("/v1/chat/completions", chat_body);
  ASSERT_EQ(s2, 200) << cc.dump();
  EXPECT_EQ(cc.at("object").as_string(), "chat.completion");
  const Json& m = cc.at("choices").as_array()[0].at("message");
  EXPECT_EQ(m.at("role").as_string(), "assistant");
  const auto prompt =
      chat->prompt_ids({{"system", "be brief"}, {"user", "hi there, how are you today?"}});
  EXPECT_EQ(m.at("content").as_string(), utf8_lossy(greedy_text(prompt, 5)));
  EXPECT_TRUE(cc.at("choices").as_array()[0].at("logprobs").at("content").is_array());
  // The same conversation again: its prompt's full blocks come from the prefix cache.
  auto [s3, again] = post("/v1/chat/completions", chat_body);
  ASSERT_EQ(s3, 200);
  EXPECT_GE(again.at("usage").at("prompt_tokens_details").at("cached_tokens").as_int(), 16);
}

TEST_F(Fixture, BadRequestsGetTheRightStatusAndAnErrorObject) {
  start();
  auto expect = [&](const std::string& path, const std::string& body, int status,
                    const std::string& param) {
    auto [s, j] = post(path, body);
    EXPECT_EQ(s, status) << body;
    ASSERT_TRUE(j.is_object() && j.contains("error")) << j.dump();
    EXPECT_FALSE(j.at("error").at("message").as_string().empty());
    if (!param.empty()) {
      EXPECT_EQ(j.at("error").at("param").as_string(), param) << body;
    }
  };
  expect("/v1/completions", "{not json", 400, "");
  expect("/v1/completions", "[1]", 400, "");
  expect("/v1/completions", R"({"max_tokens": 3})", 400, "prompt");
  expect("/v1/completions", R"({"prompt": "x", "max_tokens": "3"})", 400, "max_tokens");
  expect("/v1/completions", R"({"prompt": "x", "temperature": 7})", 400, "temperature");
  expect("/v1/completions", R"({"prompt": "x", "n": 1.5})", 400, "n");
  expect("/v1/completions", R"({"prompt": "x", "n": 1e400})", 400, "");  // not a number JSON holds
  expect("/v1/completions", R"({"prompt": [1, -2]})", 400, "prompt");
  expect("/v1/completions", R"({"prompt": "x", "max_tokens": 300})", 400, "prompt");  // > context
  expect("/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "model");
  expect("/v1/chat/completions", R"({"messages": []})", 400, "messages");
  expect("/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})", 400,
         "messages[0].role");
  auto r = client().Get("/v2/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(Json::parse(r->body).contains("error"));
}

// A body past the limit is refused with 413 and an OpenAI-shaped error, and the server goes on
// answering (cpp-httplib would otherwise buffer any body whole).
TEST_F(Fixture, OversizedBodyIs413AndTheServerGoesOn) {
  max_body_bytes = 4096;
  start();
  const std::string big = R"({"prompt": ")" + std::string(8192, 'a') + R"(", "max_tokens": 1})";
  auto [s, j] = post("/v1/completions", big);
  EXPECT_EQ(s, 413);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << j.dump();
  EXPECT_NE(j.at("error").at("message").as_string().find("4096"), std::string::npos) << j.dump();
  auto [s2, j2] = post("/v1/completions", R"({"prompt": "ab", "max_tokens": 1})");
  EXPECT_EQ(s2, 200) << j2.dump();
}

TEST_F(Fixture, StreamingSendsDeltasUsageAndDone) {
  start();
  std::string body;
  auto r = client().Post("/v1/chat/completions",
                         R"({"messages": [{"role": "user", "content": "stream please"}],
                             "max_tokens": 8, "temperature": 0, "stream": true,
                             "stream_options": {"include_usage": true}})",
                         "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  std::string text, finish;
  bool done = false, usage = false, role = false;
  size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const std::string data = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    Json j = Json::parse(data);
    EXPECT_EQ(j.at("object").as_string(), "chat.completion.chunk");
    if (j.contains("usage")) {
      usage = true;
      EXPECT_EQ(j.at("choices").size(), 0u);
      continue;
    }
    const Json& c = j.at("choices").as_array()[0];
    if (c.at("delta").contains("role")) role = true;
    if (c.at("delta").contains("content")) text += c.at("delta").at("content").as_string();
    if (!c.at("finish_reason").is_null()) finish = c.at("finish_reason").as_string();
  }
  EXPECT_TRUE(done && usage && role);
  EXPECT_FALSE(finish.empty());
  EXPECT_EQ(text, utf8_lossy(greedy_text(chat->prompt_ids({{"user", "stream please"}}), 8)));
}

TEST_F(Fixture, DisconnectCancelsAndHealthAnswersWhileBusy) {
  start();
  // A long stream, dropped by the client after its first chunk.
  {
    httplib::Client c = client();
    int chunks = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = R"({"prompt": "go on", "max_tokens": 240, "stream": true, "ignore_eos": true})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
    c.send(req);
    EXPECT_GE(chunks, 1);
  }
  // The engine lets go of the sequence at once: no block stays in use.
  bool freed = false;
  for (int i = 0; i < 200 && !freed; ++i) {
    freed = engine->stats().requests_running == 0 && engine->cache().num_used() == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(freed);
  // Busy: two long requests in flight; /health still answers at once.
  std::thread a([&] {
    post("/v1/completions", R"({"prompt": "a", "max_tokens": 200, "ignore_eos": true})");
  });
  std::thread b([&] {
    post("/v1/completions", R"({"prompt": "b", "max_tokens": 200, "ignore_eos": true})");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = std::chrono::steady_clock::now();
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("loom:num_requests_running"), std::string::npos);
  EXPECT_NE(m->body.find("loom:time_to_first_token_seconds_bucket"), std::string::npos);
  a.join();
  b.join();
}

// Past --max-queue a request gets 429 with Retry-After, counted in /metrics; a queued one
// that never runs times out (504) and is cancelled.
TEST_F(Fixture, FullQueueIs429AndTokenizeRoundTrips) {
  start(/*max_queue=*/1, /*run_engine=*/false, /*timeout=*/1.0);
  int waited = 0;
  std::thread queued(
      [&] { waited = post("/v1/completions", R"({"prompt": "a", "max_tokens": 4})").first; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto r =
      client().Post("/v1/completions", R"({"prompt": "b", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(Json::parse(r->body).at("error").at("type").as_string(), "rate_limit_error");
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("loom:request_total{outcome=\"rate_limited\"} 1\n"), std::string::npos)
      << m->body;
  queued.join();
  EXPECT_EQ(waited, 504);  // never run: the request timed out, and was cancelled
  auto [s1, t] = post("/tokenize", R"({"prompt": "héllo"})");
  ASSERT_EQ(s1, 200);
  EXPECT_EQ(t.at("count").as_int(), 6);
  auto [s2, d] = post("/detokenize", "{\"tokens\": " + t.at("tokens").dump() + "}");
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(d.at("prompt").as_string(), "héllo");
  auto [s3, e] = post("/detokenize", R"({"tokens": [99999]})");
  EXPECT_EQ(s3, 400);
}

// A burst of clients at once: every one gets an answer (200, or 429 past the queue), none a
// refused or reset connection.
TEST_F(Fixture, ABurstOfClientsAllGetAnAnswer) {
  start();
  std::atomic<int> ok{0}, limited{0}, failed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 100; ++i)
    clients.emplace_back([&, i] {
      auto r = client().Post("/v1/completions",
                             "{\"prompt\": \"x" + std::to_string(i) + "\", \"max_tokens\": 2}",
                             "application/json");
      if (!r)
        ++failed;
      else if (r->status == 200)
        ++ok;
      else if (r->status == 429)
        ++limited;
      else
        ++failed;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(ok + limited, 100);
  EXPECT_GT(ok.load(), 0);
}

// Non-streamed requests whose clients hang up are cancelled at once (the server watches their
// sockets): their sequences leave and every KV block is freed long before they could have
// finished. Then 100 concurrent raw-HTTP clients all get a complete answer, and afterwards no
// block stays in use.
TEST_F(Fixture, NonStreamedDisconnectsCancelAndFreeBlocks) {
  step_delay_ms = 20;  // 240 tokens: about 5 s if nothing cancelled them
  start();
  std::vector<std::thread> quitters;
  std::atomic<int> sent{0};
  for (int i = 0; i < 8; ++i)
    quitters.emplace_back([&, i] {
      const std::string body =
          "{\"prompt\": \"q" + std::to_string(i) + "\", \"max_tokens\": 240, \"ignore_eos\": true}";
      // Connected and sent; hung up once the request is running (below), by closing early.
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(uint16_t(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
      const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
      ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), ssize_t(req.size()));
      ++sent;
      for (int k = 0; k < 250 && engine->stats().requests_running < 8; ++k)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ::close(fd);
    });
  for (auto& t : quitters) t.join();
  ASSERT_EQ(sent.load(), 8);
  // Up to 20 s: a loaded machine may be slow to notice the hang-ups (2 s flaked at load 11);
  // had the requests finished instead, the token count below fails.
  // The engine's counts are refreshed at its step boundaries, after a client may already hold
  // its answer: wait (bounded) until they settle.
  auto settles_idle = [&] {
    for (int i = 0; i < 1000; ++i) {
      const infer::EngineStats st = engine->stats();
      if (st.requests_running == 0 && st.requests_waiting == 0 && engine->cache().num_used() == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  EXPECT_TRUE(settles_idle());
  // They were cancelled, not finished: fewer tokens than 8 x 240 were ever generated. (No
  // wall-clock bound: a loaded machine may take any time; the token count cannot lie.)
  EXPECT_LT(engine->stats().generation_tokens_total, 8 * 240);
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("loom:request_total{outcome=\"abort\"} 8"), std::string::npos) << m->body;

  // 100 concurrent clients, all answered: 200, or 429 past the queue.
  std::atomic<int> ok{0}, limited{0}, other{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 100; ++i)
    clients.emplace_back([&, i] {
      const int s = raw_http(port, "/v1/completions",
                             "{\"prompt\": \"c" + std::to_string(i) + "\", \"max_tokens\": 3}");
      (s == 200 ? ok : s == 429 ? limited : other)++;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(ok + limited, 100);
  EXPECT_GT(ok.load(), 0);
  EXPECT_TRUE(settles_idle()) << "running " << engine->stats().requests_running << ", blocks "
                              << engine->cache().num_used();
}
