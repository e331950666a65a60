#include "core/parallel.h"

#include <algorithm>
#include <atomic>

namespace loom {

void parallel_for(size_t n, int workers, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto body = [&] {
    for (;;) {
      if (failed.load()) return;
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  const size_t threads = std::min(static_cast<size_t>(std::max(1, workers)), n);
  std::vector<std::thread> extra;
  // Joined before leaving even when starting a thread throws, so no thread outlives `body`.
  try {
    for (size_t k = 1; k < threads; ++k) extra.emplace_back(body);
  } catch (...) {
    failed = true;
    for (auto& t : extra) t.join();
    throw;
  }
  body();
  for (auto& t : extra) t.join();
  if (error) std::rethrow_exception(error);
}

WorkerGroup::WorkerGroup(int n, std::function<void(int)> loop, std::function<void()> on_error) {
  auto run = [this, loop, on_error](int t) {
    try {
      loop(t);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      if (on_error) on_error();
    }
  };
  try {
    for (int t = 0; t < n; ++t) threads_.emplace_back(run, t);
  } catch (...) {
    // A loop may be waiting for work that will now never come: tell them, as for a failure.
    if (on_error) on_error();
    join_quietly();
    throw;
  }
}

WorkerGroup::~WorkerGroup() {
  join_quietly();
}

void WorkerGroup::join() {
  join_quietly();
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

void WorkerGroup::join_quietly() noexcept {
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

bool WorkerGroup::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_ != nullptr;
}

}  // namespace loom
