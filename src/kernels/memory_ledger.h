// Bookkeeping behind Backend::alloc / free: which buffer class each live allocation belongs
// to, and the bytes held and the peak per class (Backend::memory_report). Pure host code shared
// by every backend, so each reports alike (header-only: loom_kernels and loom_cuda both use it
// and neither links the other); thread-safe.
#pragma once

#include <cstddef>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/error.h"

namespace loom {

class MemoryLedger {
 public:
  void add(void* p, size_t bytes, const char* cls);
  // The size `p` was recorded with; throws loom::Error for a pointer it never recorded (a
  // double free, or a pointer from elsewhere), naming `backend`.
  size_t remove(void* p, const char* backend);
  size_t held(const std::string& cls) const;
  size_t peak(const std::string& cls) const;
  size_t held_total() const;
  size_t live() const;  // allocations not yet freed
  // "  <class>: <held> MiB held, <peak> MiB peak" per class, then the total held.
  std::string report(const char* backend) const;

 private:
  struct Class {
    size_t held = 0, peak = 0;
  };
  struct Live {
    size_t bytes;
    const char* cls;
  };
  mutable std::mutex mu_;
  std::map<std::string, Class> classes_;
  std::unordered_map<void*, Live> live_;
};

inline void MemoryLedger::add(void* p, size_t bytes, const char* cls) {
  std::lock_guard<std::mutex> lock(mu_);
  live_[p] = {bytes, cls};
  Class& c = classes_[cls];
  c.held += bytes;
  if (c.held > c.peak) c.peak = c.held;
}

inline size_t MemoryLedger::remove(void* p, const char* backend) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  LOOM_CHECK(it != live_.end(), backend, " backend: free of a pointer it did not allocate (", p,
             ")");
  const Live l = it->second;
  live_.erase(it);
  classes_[l.cls].held -= l.bytes;
  return l.bytes;
}

inline size_t MemoryLedger::held(const std::string& cls) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = classes_.find(cls);
  return it == classes_.end() ? 0 : it->second.held;
}

inline size_t MemoryLedger::peak(const std::string& cls) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = classes_.find(cls);
  return it == classes_.end() ? 0 : it->second.peak;
}

inline size_t MemoryLedger::held_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t t = 0;
  for (const auto& [name, c] : classes_) t += c.held;
  return t;
}

inline size_t MemoryLedger::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

inline std::string MemoryLedger::report(const char* backend) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto mib = [](size_t b) { return double(b) / double(1 << 20); };
  std::string s = cat(backend, " buffers:\n");
  size_t total = 0;
  char line[256];
  for (const auto& [name, c] : classes_) {
    std::snprintf(line, sizeof line, "  %-16s %10.1f MiB held, %10.1f MiB peak\n", name.c_str(),
                  mib(c.held), mib(c.peak));
    s += line;
    total += c.held;
  }
  std::snprintf(line, sizeof line, "  %-16s %10.1f MiB held\n", "total", mib(total));
  return s + line;
}

}  // namespace loom
