#include "rl/http_env.h"

#include <array>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "core/rng.h"

#ifdef LOOM_RL_HAVE_HTTP
#include <httplib.h>
#endif

namespace loom::rl {

std::vector<Task> load_task_file(const std::string& path) {
  std::ifstream f(path);
  LOOM_CHECK(f, "cannot open the task file ", path);
  std::vector<Task> out;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = cat(path, ":", n);
    Json j = Json::parse(line, where);
    LOOM_CHECK(j.is_object() && j.contains("prompt") && j.at("prompt").is_string(), where,
               ": a task needs a string \"prompt\"");
    Task t;
    t.prompt = j.at("prompt").as_string();
    LOOM_CHECK(!t.prompt.empty(), where, ": an empty prompt");
    if (j.contains("answer")) {
      LOOM_CHECK(j.at("answer").is_string(), where, ": \"answer\" must be a string");
      t.answer = j.at("answer").as_string();
    }
    out.push_back(std::move(t));
  }
  LOOM_CHECK(!out.empty(), "the task file ", path, " holds no tasks");
  return out;
}

uint64_t shuffled_index(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t i) {
  LOOM_CHECK(n > 0 && i < n, "shuffled_index: place ", i, " of ", n);
  // Fisher-Yates from the last place down; only the swaps that reach place i matter, but the
  // whole permutation is cheap beside a rollout (n is a task file's length).
  std::vector<uint64_t> perm(static_cast<size_t>(n));
  for (uint64_t k = 0; k < n; ++k) perm[size_t(k)] = k;
  const uint64_t key = 0x7a5c5u ^ (epoch * 0x9e3779b97f4a7c15ull);
  for (uint64_t k = n - 1; k > 0; --k) {
    const std::array<uint32_t, 4> r = philox(seed, key, k);
    const uint64_t j = ((uint64_t(r[0]) << 32) | r[1]) % (k + 1);
    std::swap(perm[size_t(k)], perm[size_t(j)]);
  }
  return perm[size_t(i)];
}

#ifdef LOOM_RL_HAVE_HTTP
namespace {

// One POST whose whole exchange (connect, request, headers, body) ends within `seconds`.
// cpp-httplib's timeouts bound each read and write, not the call: a server that sends its
// headers and then a byte every half second would hold the call for ever. A watcher shuts the
// client's socket at the deadline (Client::stop, safe from another thread), which ends the call
// with an error; *late says that it was the deadline.
httplib::Result post_within(httplib::Client& cli, const std::string& path, const std::string& body,
                            double seconds, bool* late) {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  *late = false;
  std::thread watcher([&] {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; })) {
      *late = true;
      cli.stop();
    }
  });
  httplib::Result res = cli.Post(path, body, "application/json");
  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_one();
  watcher.join();
  return res;
}

class HttpEnvironment : public Environment {
 public:
  HttpEnvironment(const HttpEnvOptions& o, std::vector<Task> tasks, std::vector<Task> eval_tasks,
                  std::unique_ptr<Environment> prompts, std::shared_ptr<HttpEnvStats> stats)
      : opt_(o),
        tasks_(std::move(tasks)),
        eval_tasks_(std::move(eval_tasks)),
        prompts_(std::move(prompts)),
        stats_(std::move(stats)) {
    const std::string& u = o.url;
    LOOM_CHECK(u.rfind("http://", 0) == 0, "rl.env_url must start with http://, got '", u, "'");
    const size_t slash = u.find('/', 7);
    host_ = u.substr(0, slash);
    path_ = slash == std::string::npos ? "/" : u.substr(slash);
    LOOM_CHECK(host_.size() > 7, "rl.env_url '", u, "' names no host");
    LOOM_CHECK(o.timeout_s > 0 && o.timeout_s <= 3600, "rl.env_timeout must lie in (0, 3600] s");
    LOOM_CHECK(o.retries >= 0 && o.retries <= 100, "rl.env_retries must lie in [0, 100]");
    LOOM_CHECK(!tasks_.empty() || prompts_, "an HTTP environment needs tasks");
  }
  std::string name() const override { return "http"; }
  Task task(uint64_t seed, uint64_t index) const override {
    if (tasks_.empty()) return prompts_->task(seed, index);
    const uint64_t n = tasks_.size();
    return tasks_[size_t(shuffled_index(seed, index / n, n, index % n))];
  }
  Task eval_task(uint64_t seed, uint64_t index) const override {
    if (!eval_tasks_.empty()) return eval_tasks_[index % eval_tasks_.size()];
    LOOM_CHECK(tasks_.empty(), "held-out evaluation with a training task file (rl.env_tasks) ",
               "needs a held-out one (rl.env_eval_tasks, --env-eval-tasks FILE): the training ",
               "tasks are no held-out set");
    return prompts_->task(seed, index);
  }
  int64_t eval_task_count() const override {
    return eval_tasks_.empty() ? -1 : int64_t(eval_tasks_.size());
  }
  double reward(const Task& t, const std::string& reply) const override {
    Json body = Json::object();
    body["prompt"] = t.prompt;
    body["completion"] = reply;
    body["answer"] = t.answer;
    const std::string text = body.dump();
    const auto ms = std::chrono::milliseconds(int64_t(opt_.timeout_s * 1000));
    std::string last;
    double backoff = opt_.backoff_s;
    for (int attempt = 0; attempt <= opt_.retries; ++attempt) {
      if (attempt > 0) {
        count(&HttpEnvStats::retries);
        std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
        backoff *= 2;
      }
      count(&HttpEnvStats::calls);
      httplib::Client cli(host_);
      cli.set_connection_timeout(ms);
      cli.set_read_timeout(ms);
      cli.set_write_timeout(ms);
      bool late = false;
      auto res = post_within(cli, path_, text, opt_.timeout_s, &late);
      if (late) {
        last = cat("no whole answer within ", opt_.timeout_s, " s");
        continue;
      }
      if (!res) {
        last = cat("no answer (", httplib::to_string(res.error()), ")");
        continue;
      }
      if (res->status >= 500) {
        last = cat("status ", res->status);
        continue;
      }
      if (res->status != 200) {
        count(&HttpEnvStats::failed);
        fail("environment ", opt_.url, ": status ", res->status, " (not retried)");
      }
      return parse(res->body);
    }
    count(&HttpEnvStats::failed);
    fail("environment ", opt_.url, ": ", last, " after ", opt_.retries + 1, " tries of ",
         opt_.timeout_s, " s");
  }

 private:
  double parse(const std::string& body) const {
    Json j;
    try {
      j = Json::parse(body, opt_.url);
    } catch (const Error& e) {
      count(&HttpEnvStats::malformed);
      fail("environment ", opt_.url, ": malformed response: ", e.what());
    }
    if (!j.is_object() || !j.contains("reward") || !j.at("reward").is_number()) {
      count(&HttpEnvStats::malformed);
      fail("environment ", opt_.url,
           ": the response has no numeric \"reward\": ", body.substr(0, 200));
    }
    const double r = j.at("reward").as_double();
    if (!(r >= 0 && r <= 1)) {
      count(&HttpEnvStats::out_of_range);
      fail("environment ", opt_.url, ": reward ", r, " outside [0, 1]");
    }
    return r;
  }
  void count(int64_t HttpEnvStats::*field) const {
    std::lock_guard<std::mutex> lock(mu_);
    ++((*stats_).*field);
  }

  HttpEnvOptions opt_;
  std::vector<Task> tasks_, eval_tasks_;
  std::unique_ptr<Environment> prompts_;
  std::shared_ptr<HttpEnvStats> stats_;
  std::string host_, path_;
  mutable std::mutex mu_;
};

}  // namespace

bool http_environment_available() {
  return true;
}

std::unique_ptr<Environment> make_http_environment(const HttpEnvOptions& opt,
                                                   std::vector<Task> tasks,
                                                   std::vector<Task> eval_tasks,
                                                   std::unique_ptr<Environment> prompts,
                                                   std::shared_ptr<HttpEnvStats>* stats) {
  auto st = std::make_shared<HttpEnvStats>();
  if (stats) *stats = st;
  return std::make_unique<HttpEnvironment>(opt, std::move(tasks), std::move(eval_tasks),
                                           std::move(prompts), st);
}
#else
bool http_environment_available() {
  return false;
}

std::unique_ptr<Environment> make_http_environment(const HttpEnvOptions&, std::vector<Task>,
                                                   std::vector<Task>, std::unique_ptr<Environment>,
                                                   std::shared_ptr<HttpEnvStats>*) {
  fail("this build has no HTTP client (install libcpp-httplib-dev: scripts/setup.sh)");
}
#endif

}  // namespace loom::rl
