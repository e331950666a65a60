// Device memory without allocation in the training step: every buffer class (parameters,
// gradients, optimizer state, activations, workspace) is ONE allocation made up front, and
// buffers are carved out of it by a bump pointer. Scratch is stack-like (mark / release), so
// an op's temporaries are given back when it returns. Peak use is tracked per class.
//
// Pure host bookkeeping: the allocation itself goes through injected functions (cudaMalloc
// on the GPU, malloc in the host tests), so everything here is testable without a device.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>

namespace loom {

// One contiguous region handed out by a bump pointer.
class BumpRegion {
 public:
  static constexpr size_t kAlign = 256;  // cuBLASLt and vector loads like 256-byte alignment

  BumpRegion() = default;
  BumpRegion(std::string name, void* base, size_t capacity)
      : name_(std::move(name)), base_(static_cast<char*>(base)), capacity_(capacity) {}

  // Carves `bytes` (rounded up to kAlign); throws loom::Error naming the region, the request
  // and the capacity when it does not fit.
  void* take(size_t bytes, const char* what = "buffer");
  template <typename T>
  T* take_n(size_t n, const char* what = "buffer") {
    return static_cast<T*>(take(n * sizeof(T), what));
  }
  size_t mark() const { return used_; }
  void release(size_t mark);  // frees everything taken after `mark`
  void reset() { release(0); }

  const std::string& name() const { return name_; }
  void* base() const { return base_; }
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t available() const { return capacity_ - used_; }

 private:
  std::string name_;
  char* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, peak_ = 0;
};

// Scoped scratch: everything taken through the region while this lives is released after.
class ScratchScope {
 public:
  explicit ScratchScope(BumpRegion& r) : r_(r), mark_(r.mark()) {}
  ~ScratchScope() { r_.release(mark_); }
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

 private:
  BumpRegion& r_;
  size_t mark_;
};

class DeviceArena {
 public:
  using AllocFn = std::function<void*(size_t)>;
  using FreeFn = std::function<void(void*)>;

  DeviceArena() = default;
  DeviceArena(AllocFn alloc, FreeFn free) : alloc_(std::move(alloc)), free_(std::move(free)) {}
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  DeviceArena(DeviceArena&& o) noexcept { *this = std::move(o); }
  DeviceArena& operator=(DeviceArena&& o) noexcept;

  // Plan a class: reserve() adds bytes to it (each request rounded to the alignment), any
  // number of times before commit(). commit() makes its one allocation; a class is committed
  // once (a second commit, or reserving into a committed class, is an error).
  void reserve(const std::string& cls, size_t bytes);
  BumpRegion& commit(const std::string& cls);
  // reserve + commit in one call.
  BumpRegion& create(const std::string& cls, size_t bytes);

  bool has(const std::string& cls) const;
  BumpRegion& region(const std::string& cls);  // committed classes only
  size_t planned(const std::string& cls) const;

  size_t allocations() const { return allocations_; }  // underlying allocator calls
  size_t total_capacity() const;
  size_t total_peak() const;
  // One line per class: name, capacity, peak (MiB), then the totals.
  std::string report() const;

 private:
  struct Class {
    std::string name;
    size_t planned = 0;
    bool committed = false;
    BumpRegion region;
  };
  Class* find(const std::string& cls);
  const Class* find(const std::string& cls) const;

  AllocFn alloc_;
  FreeFn free_;
  std::deque<Class> classes_;  // deque: regions handed out stay put as classes are added
  size_t allocations_ = 0;
};

inline size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

}  // namespace loom
