// The HTTP environment against an in-process server that answers, fails then answers, hangs,
// returns garbage and returns rewards out of range; task files with bad lines; and a GRPO step
// whose environment returns garbage: its groups are dropped and counted, the step goes on.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "rl/evaluate.h"
#include "rl/grpo_trainer.h"
#include "rl/http_env.h"
#include "rl_test_util.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::rl;

namespace {

struct Server {
  httplib::Server srv;
  std::thread th;
  int port = 0;
  int flaky_calls = 0;
  std::atomic<bool> stopping{false};
  Server() {
    srv.Post("/ok", [](const httplib::Request& q, httplib::Response& r) {
      Json j = Json::parse(q.body);
      const bool right = j.at("completion").as_string() == j.at("answer").as_string();
      r.set_content(cat("{\"reward\": ", right ? 1 : 0, "}"), "application/json");
    });
    srv.Post("/flaky", [this](const httplib::Request&, httplib::Response& r) {
      if (flaky_calls++ < 2) {
        r.status = 503;
        return;
      }
      r.set_content("{\"reward\": 0.25}", "application/json");
    });
    srv.Post("/hang", [](const httplib::Request&, httplib::Response& r) {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      r.set_content("{\"reward\": 1}", "application/json");
    });
    srv.Post("/garbage", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("<html>oops", "text/html");
    });
    srv.Post("/noreward", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("{\"score\": 1}", "application/json");
    });
    srv.Post("/range", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("{\"reward\": 7.5}", "application/json");
    });
    // The body must be JSON in valid UTF-8 (a strict check, not Loom's parser alone): reward 1
    // when the completion arrived as "ab" + U+FFFD, 0.5 for any other valid body, 400 otherwise.
    srv.Post("/utf8", [](const httplib::Request& q, httplib::Response& r) {
      bool valid = true;
      for (size_t i = 0; i < q.body.size() && valid;) {
        const auto c = static_cast<unsigned char>(q.body[i]);
        const size_t len = c < 0x80         ? 1
                           : (c >> 5) == 6  ? 2
                           : (c >> 4) == 14 ? 3
                           : (c >> 3) == 30 ? 4
                                            : 0;
        valid = len > 0 && i + len <= q.body.size();
        for (size_t k = 1; valid && k < len; ++k)
          valid = (static_cast<unsigned char>(q.body[i + k]) & 0xC0) == 0x80;
        i += len;
      }
      Json j;
      try {
        if (valid) j = Json::parse(q.body);
      } catch (const Error&) {
        valid = false;
      }
      if (!valid) {
        r.status = 400;
        return;
      }
      const bool replaced = j.at("completion").as_string() == "ab\xEF\xBF\xBD";
      r.set_content(replaced ? "{\"reward\": 1}" : "{\"reward\": 0.5}", "application/json");
    });
    srv.Post("/missing", [](const httplib::Request&, httplib::Response& r) { r.status = 404; });
    // Headers at once, then one byte of the body every 0.5 s (for 20 s at most): each read
    // finishes well within any read timeout, the whole answer never does.
    srv.Post("/trickle", [this](const httplib::Request&, httplib::Response& r) {
      r.set_chunked_content_provider("application/json", [this](size_t, httplib::DataSink& sink) {
        for (int i = 0; i < 40 && !stopping; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          if (!sink.write(" ", 1)) return false;
        }
        sink.write("{\"reward\": 1}", 13);
        sink.done();
        return true;
      });
    });
    port = srv.bind_to_any_port("127.0.0.1");
    th = std::thread([this] { srv.listen_after_bind(); });
    // Bound wait for the listener (the socket is bound already, so a client connects anyway).
    for (int i = 0; i < 200 && !srv.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~Server() {
    stopping = true;
    srv.stop();
    th.join();
  }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port) + path;
  }
};

std::unique_ptr<Environment> env(const Server& s, const std::string& path,
                                 std::shared_ptr<HttpEnvStats>* st, double timeout = 2) {
  HttpEnvOptions o;
  o.url = s.url(path);
  o.timeout_s = timeout;
  o.retries = 2;
  o.backoff_s = 0.01;
  return make_http_environment(o, {{"Reverse: a b", "b a", {}}}, {}, nullptr, st);
}

std::string error_of(const Environment& e, const std::string& reply) {
  try {
    e.reward(e.task(1, 0), reply);
  } catch (const Error& x) {
    return x.what();
  }
  return "";
}

}  // namespace

TEST(HttpEnv, ScoresThroughTheServer) {
  Server s;
  std::shared_ptr<HttpEnvStats> st;
  auto e = env(s, "/ok", &st);
  EXPECT_EQ(e->task(1, 5).prompt, "Reverse: a b");
  EXPECT_EQ(e->reward(e->task(1, 0), "b a"), 1.0);
  EXPECT_EQ(e->reward(e->task(1, 0), "a b"), 0.0);
  EXPECT_EQ(st->calls, 2);
  auto f = env(s, "/flaky", &st);  // two 503s, then an answer: retried
  EXPECT_EQ(f->reward(f->task(1, 0), "x"), 0.25);
  EXPECT_EQ(st->retries, 2);
  EXPECT_EQ(st->failed, 0);
}

TEST(HttpEnv, FailuresAreClearErrorsAndCounted) {
  Server s;
  std::shared_ptr<HttpEnvStats> st;
  const auto t0 = std::chrono::steady_clock::now();
  auto hang = env(s, "/hang", &st, 0.2);
  EXPECT_NE(error_of(*hang, "x").find("after 3 tries"), std::string::npos);
  EXPECT_EQ(st->failed, 1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  auto g = env(s, "/garbage", &st);
  EXPECT_NE(error_of(*g, "x").find("malformed response"), std::string::npos);
  EXPECT_EQ(st->malformed, 1);
  auto n = env(s, "/noreward", &st);
  EXPECT_NE(error_of(*n, "x").find("no numeric \"reward\""), std::string::npos);
  auto r = env(s, "/range", &st);
  EXPECT_NE(error_of(*r, "x").find("reward 7.5 outside [0, 1]"), std::string::npos);
  EXPECT_EQ(st->out_of_range, 1);
  auto m = env(s, "/missing", &st);
  EXPECT_NE(error_of(*m, "x").find("status 404"), std::string::npos);
  HttpEnvOptions bad;
  bad.url = "ftp://x";
  EXPECT_THROW(make_http_environment(bad, {{"p", "", {}}}, {}, nullptr), Error);
}

// --env-timeout bounds the whole exchange: a server trickling its body a byte every 0.5 s is cut
// at the deadline on every try (3 tries of 1 s here), not kept for as long as it trickles.
TEST(HttpEnv, TheTimeoutCoversTheWholeExchange) {
  Server s;
  std::shared_ptr<HttpEnvStats> st;
  const auto t0 = std::chrono::steady_clock::now();
  auto e = env(s, "/trickle", &st, 1.0);
  const std::string err = error_of(*e, "x");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(err.find("no whole answer within 1 s after 3 tries of 1 s"), std::string::npos) << err;
  EXPECT_LT(took, 5.0);
  EXPECT_EQ(st->failed, 1);
}

TEST(HttpEnv, TaskFilesWithBadLinesNameTheLine) {
  test::TempDir d("rl_tasks");
  auto write = [&](const std::string& text) {
    std::ofstream(d / "t.jsonl") << text;
    return d / "t.jsonl";
  };
  auto tasks =
      load_task_file(write("{\"prompt\": \"p1\", \"answer\": \"a1\"}\n\n{\"prompt\": \"p2\"}\n"));
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].answer, "a1");
  auto msg = [&](const std::string& text) {
    try {
      load_task_file(write(text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("{\"prompt\": \"p\"}\n{\"prompt\": 3}\n").find("t.jsonl:2"), std::string::npos);
  EXPECT_NE(msg("{\"prompt\": \"p\"}\nnot json\n").find("t.jsonl:2"), std::string::npos);
  EXPECT_NE(msg("{\"prompt\": \"\"}\n").find("empty prompt"), std::string::npos);
  EXPECT_NE(msg("\n").find("holds no tasks"), std::string::npos);
  EXPECT_THROW(load_task_file(d / "absent.jsonl"), Error);
}

TEST(HttpEnv, AGarbageEnvironmentDropsGroupsNotTheJob) {
  Server s;
  std::shared_ptr<HttpEnvStats> st;
  auto e = env(s, "/garbage", &st);
  Decoder m(rltest::tiny_config(), cpu_backend());
  m.params().init(3);
  auto tok = data::byte_chatml_tokenizer();
  data::ChatTemplate chat("chatml", tok);
  RlOptions o;
  o.prompts_per_step = 2;
  o.group_size = 2;
  o.max_tokens = 3;
  GrpoTrainer t(m, tok, chat, *e, o);
  const RlStepStats r = t.step();
  EXPECT_EQ(r.dropped_env, 2);
  EXPECT_EQ(r.groups, 0);
  EXPECT_EQ(st->malformed, 2);
}

// A completion cut inside a UTF-8 character (the first two of the euro sign's three bytes, as a
// max_tokens limit leaves a byte-level reply) reaches the environment as valid JSON in valid
// UTF-8, the broken tail replaced by U+FFFD.
TEST(HttpEnv, ACompletionEndingInsideAUtf8CharacterIsSentAsValidJson) {
  Server s;
  std::shared_ptr<HttpEnvStats> st;
  auto e = env(s, "/utf8", &st);
  EXPECT_EQ(e->reward(e->task(1, 0), "ab\xE2\x82"), 1.0);
  EXPECT_EQ(e->reward(e->task(1, 0), "ab\xFF"), 1.0);  // a byte that starts no character
  EXPECT_EQ(st->failed, 0);
}

// A task file is drawn epoch by epoch in an order the seed shuffles: each epoch holds every
// task once, and two seeds give two orders. Held-out tasks come from their own list (cycled,
// its length the evaluation's bound); without one, evaluating on a training file is refused.
TEST(HttpEnv, TrainingOrderFollowsTheSeedAndEvaluationNeedsItsOwnTasks) {
  std::vector<Task> train, held;
  for (int i = 0; i < 20; ++i) train.push_back({"train " + std::to_string(i), "", {}});
  for (int i = 0; i < 3; ++i) held.push_back({"held " + std::to_string(i), "", {}});
  HttpEnvOptions o;
  o.url = "http://127.0.0.1:1/x";
  auto e = make_http_environment(o, train, held, nullptr);
  std::vector<std::string> a, b;
  for (uint64_t i = 0; i < 40; ++i) {
    a.push_back(e->task(1, i).prompt);
    b.push_back(e->task(2, i).prompt);
  }
  EXPECT_NE(a, b) << "the seed does not change the training order";
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<std::string> seen(a.begin() + 20 * epoch, a.begin() + 20 * (epoch + 1));
    EXPECT_EQ(seen.size(), 20u) << "epoch " << epoch << " repeats a task";
  }
  EXPECT_NE(std::vector<std::string>(a.begin(), a.begin() + 20),
            std::vector<std::string>(a.begin() + 20, a.end()))
      << "every epoch in the same order";
  EXPECT_EQ(e->task(1, 7).prompt, a[7]);  // the same (seed, index), the same task
  EXPECT_EQ(e->eval_task(heldout_seed(1), 1).prompt, "held 1");
  EXPECT_EQ(e->eval_task(heldout_seed(1), 4).prompt, "held 1");
  EXPECT_EQ(e->eval_task_count(), 3);
  auto no_held = make_http_environment(o, train, {}, nullptr);
  try {
    no_held->eval_task(heldout_seed(1), 0);
    ADD_FAILURE() << "evaluated on training tasks";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("rl.env_eval_tasks"), std::string::npos) << x.what();
  }
  // Built-in prompts: the generator's held-out seed, as without HTTP.
  auto gen = make_http_environment(o, {}, {}, make_environment("reverse"));
  EXPECT_EQ(gen->eval_task(heldout_seed(1), 3).prompt,
            make_environment("reverse")->task(heldout_seed(1), 3).prompt);
  EXPECT_EQ(shuffled_index(5, 0, 1, 0), 0u);
  EXPECT_THROW(shuffled_index(5, 0, 3, 3), Error);
}
