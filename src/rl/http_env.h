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

// Prompts from `tasks` (cycled) or, when empty, from the built-in `prompts` environment.
std::unique_ptr<Environment> make_http_environment(const HttpEnvOptions& opt,
                                                   std::vector<Task> tasks,
                                                   std::unique_ptr<Environment> prompts,
                                                   std::shared_ptr<HttpEnvStats>* stats = nullptr);

}  // namespace loom::rl
