// A hook the model calls at a point of its step, with several subscribers: data parallelism's
// gradient reduction, ZeRO-3's parameter gathering, frozen-parameter sharding and a profiler
// can all listen to the same model. Subscribers are called in the order they subscribed.
// Assigning a function keeps the single-subscriber form working: it replaces every subscriber
// (nullptr clears them).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace loom {

template <typename... Args>
class Hook {
 public:
  using Fn = std::function<void(Args...)>;
  // Returns an id for unsubscribe.
  int64_t subscribe(Fn fn) {
    subs_.emplace_back(next_, std::move(fn));
    return next_++;
  }
  // Removes the subscriber `id` (no-op when it has gone already).
  void unsubscribe(int64_t id) {
    for (auto it = subs_.begin(); it != subs_.end(); ++it)
      if (it->first == id) {
        subs_.erase(it);
        return;
      }
  }
  Hook& operator=(Fn fn) {
    subs_.clear();
    if (fn) subscribe(std::move(fn));
    return *this;
  }
  Hook& operator=(std::nullptr_t) {
    subs_.clear();
    return *this;
  }
  explicit operator bool() const { return !subs_.empty(); }
  size_t size() const { return subs_.size(); }
  void operator()(Args... args) const {
    for (const auto& s : subs_) s.second(args...);
  }

 private:
  std::vector<std::pair<int64_t, Fn>> subs_;
  int64_t next_ = 0;
};

}  // namespace loom
