// A buffer on a Backend's device that frees itself: it remembers the backend it came from, so
// the Decoder (and anything else holding device memory) owns buffers without knowing whether
// they are host or device memory. The backend must outlive its buffers.
#pragma once

#include <cstddef>
#include <utility>

#include "kernels/backend.h"

namespace loom {

class BackendBuffer {
 public:
  BackendBuffer() = default;
  // `cls`: the buffer class reported by Backend::memory_report (a string literal).
  BackendBuffer(Backend& be, size_t bytes, const char* cls)
      : be_(&be), p_(be.alloc(bytes, cls)), bytes_(bytes) {}
  // Zero-filled (Backend::alloc_zeroed).
  static BackendBuffer zeroed(Backend& be, size_t bytes, const char* cls) {
    BackendBuffer b;
    b.be_ = &be;
    b.p_ = be.alloc_zeroed(bytes, cls);
    b.bytes_ = bytes;
    return b;
  }
  ~BackendBuffer() { reset(); }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  BackendBuffer(BackendBuffer&& o) noexcept
      : be_(o.be_), p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_;
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  // Frees the buffer (back to empty).
  void reset() {
    if (p_) be_->free(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  // At least `bytes` (contents undefined afterwards when it grows; a scratch buffer's use).
  // Returns the data.
  void* ensure(Backend& be, size_t bytes, const char* cls) {
    if (p_ && be_ == &be && bytes <= bytes_) return p_;
    reset();
    *this = BackendBuffer(be, bytes, cls);
    return p_;
  }
  template <typename T>
  T* ensure_n(Backend& be, size_t n, const char* cls) {
    return static_cast<T*>(ensure(be, n * sizeof(T), cls));
  }

  void* data() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return p_ == nullptr; }
  Backend* backend() const { return be_; }

 private:
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace loom
