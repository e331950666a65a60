// An environment scored by an external HTTP service (a code sandbox, a NeMo Gym-style server):
// for each completion Loom POSTs
//   {"prompt": "...", "completion": "...", "answer": "...", "task_index": 12}
// to the URL and expects 200 with {"reward": r}, r a number in [0, 1]. Each call has a timeout
// and is retried (transport errors and 5xx only) a bounded number of times; a call that still
// fails, a malformed answer or a reward outside [0, 1] throws with the URL and what was wrong,
// which the rollout side counts and turns into a dropped group, never a failed job. Prompts come
// from a task file (JSONL: {"prompt": ..., "answer": ...} a line) or a built-in task generator.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "rl/env.h"

namespace loom::rl {

struct HttpEnvOptions {
  std::string url;         // http://host:port/path
  double timeout_s = 10;   // per call (connect, read and write)
  int retries = 2;         // after the first try
  double backoff_s = 0.2;  // before each retry, doubling
};

struct HttpEnvStats {
  int64_t calls = 0, retries = 0, failed = 0, malformed = 0, out_of_range = 0;
};

// The tasks of a JSONL task file; throws naming the file and line of a bad one.
std::vector<Task> load_task_file(const std::string& path);

// Whether this build has the HTTP client (cpp-httplib).
bool http_environment_available();

// Training prompts from `tasks` or, when empty, from the built-in `prompts` environment. A task
// list is drawn epoch by epoch in an order the seed shuffles (task(seed, i): epoch i / n, place
// i % n of that epoch's permutation of the n tasks), so runs of other seeds see other orders.
// Held-out evaluation (eval_task) reads `eval_tasks` (--env-eval-tasks); with training tasks and
// no held-out list it throws (the training tasks are no held-out set); with built-in prompts and
// no list it takes the generator's held-out seed.
std::unique_ptr<Environment> make_http_environment(const HttpEnvOptions& opt,
                                                   std::vector<Task> tasks,
                                                   std::vector<Task> eval_tasks,
                                                   std::unique_ptr<Environment> prompts,
                                                   std::shared_ptr<HttpEnvStats>* stats = nullptr);

// Place `i` of the permutation of [0, n) that (seed, epoch) draws (Fisher-Yates over the
// counter-based RNG).
uint64_t shuffled_index(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t i);

}  // namespace loom::rl
