#include "rl/replay_buffer.h"

#include <chrono>

#include "core/error.h"

namespace loom::rl {

ReplayBuffer::ReplayBuffer(int64_t max_staleness) : max_staleness_(max_staleness) {
  LOOM_CHECK(max_staleness >= 0 && max_staleness <= 1000,
             "rl.max_staleness must lie in [0, 1000], got ", max_staleness);
}

void ReplayBuffer::push(PromptGroup g) {
  LOOM_CHECK(g.version <= g.target_step, "a rollout group of weight version ", g.version,
             " targets the earlier learner step ", g.target_step);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.pushed;
    if (g.target_step - g.version > max_staleness_) {
      ++stats_.dropped_stale;
      ++dropped_[g.target_step];  // the learner must not wait for it either
    } else {
      groups_[g.target_step].push_back(std::move(g));
    }
  }
  cv_.notify_all();
}

void ReplayBuffer::drop(int64_t target_step, int64_t n, bool timeout) {
  if (n <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped_[target_step] += n;
    (timeout ? stats_.dropped_timeout : stats_.dropped_env) += n;
  }
  cv_.notify_all();
}

void ReplayBuffer::push_step(int64_t target_step, std::vector<PromptGroup> groups,
                             int64_t dropped_timeout, int64_t dropped_env) {
  for (const PromptGroup& g : groups)
    LOOM_CHECK(g.version <= g.target_step && g.target_step == target_step,
               "a rollout group of weight version ", g.version, " for step ", g.target_step,
               " in the batch of step ", target_step);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (PromptGroup& g : groups) {
      ++stats_.pushed;
      if (g.target_step - g.version > max_staleness_) {
        ++stats_.dropped_stale;
        ++dropped_[target_step];
      } else {
        groups_[target_step].push_back(std::move(g));
      }
    }
    dropped_[target_step] += dropped_timeout + dropped_env;
    stats_.dropped_timeout += dropped_timeout;
    stats_.dropped_env += dropped_env;
    complete_[target_step] = true;
  }
  cv_.notify_all();
}

std::vector<PromptGroup> ReplayBuffer::take(int64_t step, int64_t expected, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  // Whatever targets an earlier step is at least one step staler than when it was made for; the
  // learner has moved on, so it goes (and is counted).
  for (auto it = groups_.begin(); it != groups_.end() && it->first < step;) {
    stats_.dropped_stale += int64_t(it->second.size());
    it = groups_.erase(it);
  }
  dropped_.erase(dropped_.begin(), dropped_.lower_bound(step));
  complete_.erase(complete_.begin(), complete_.lower_bound(step));
  auto have = [&] {
    auto g = groups_.find(step);
    auto d = dropped_.find(step);
    return (g == groups_.end() ? 0 : int64_t(g->second.size())) +
           (d == dropped_.end() ? 0 : d->second);
  };
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(0.0, timeout_s));
  auto ready = [&] { return have() >= expected || complete_.count(step) > 0; };
  while (failed_.empty() && !ready())
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
  LOOM_CHECK(failed_.empty(), "the rollouts stopped: ", failed_);
  const int64_t got = have();
  LOOM_CHECK(ready(), "learner step ", step, ": waited ", timeout_s, " s for ", expected,
             " rollout groups (rl.learner_timeout) but only ", got,
             " arrived or were dropped; the rollout side is stuck or too slow");
  std::vector<PromptGroup> out;
  auto g = groups_.find(step);
  if (g != groups_.end()) {
    out = std::move(g->second);
    groups_.erase(g);
  }
  dropped_.erase(step);
  complete_.erase(step);
  // The bound is checked again where the data is used, not only where it entered.
  for (const PromptGroup& x : out)
    LOOM_CHECK(step - x.version <= max_staleness_ && x.version <= step, "a group of version ",
               x.version, " reached learner step ", step, " (max_staleness ", max_staleness_, ")");
  stats_.taken += int64_t(out.size());
  return out;
}

void ReplayBuffer::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.empty()) failed_ = why.empty() ? "unknown failure" : why;
  }
  cv_.notify_all();
}

ReplayStats ReplayBuffer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t ReplayBuffer::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (auto& [s, v] : groups_) n += int64_t(v.size());
  return n;
}

std::vector<BufferedStep> ReplayBuffer::contents() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int64_t, BufferedStep> by_step;
  for (auto& [s, v] : groups_) {
    by_step[s].target_step = s;
    by_step[s].groups = v;
  }
  for (auto& [s, n] : dropped_) {
    by_step[s].target_step = s;
    by_step[s].dropped = n;
  }
  for (auto& [s, c] : complete_) {
    by_step[s].target_step = s;
    by_step[s].complete = c;
  }
  std::vector<BufferedStep> out;
  for (auto& [s, b] : by_step) out.push_back(std::move(b));
  return out;
}

void ReplayBuffer::restore(std::vector<BufferedStep> steps, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_CHECK(groups_.empty() && dropped_.empty(), "the replay buffer is restored only when empty");
  for (BufferedStep& b : steps) {
    LOOM_CHECK(b.target_step >= step && b.dropped >= 0, "a buffered step ", b.target_step, " (",
               b.dropped, " dropped) for a learner resuming at step ", step);
    for (PromptGroup& g : b.groups) {
      LOOM_CHECK(g.target_step == b.target_step && g.version >= 0 && g.version <= step,
                 "a buffered group of task ", g.task_index, " (target step ", g.target_step,
                 ", weight version ", g.version, ") does not fit a learner resuming at step ",
                 step);
      if (b.target_step - g.version > max_staleness_) {  // a resume with a tighter bound
        ++stats_.dropped_stale;
        ++dropped_[b.target_step];
        continue;
      }
      groups_[b.target_step].push_back(std::move(g));
    }
    if (b.dropped > 0) dropped_[b.target_step] += b.dropped;
    if (b.complete) complete_[b.target_step] = true;
  }
}

}  // namespace loom::rl
