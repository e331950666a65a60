// Scratch memory for kernels that need temporaries (per-block partial sums). The buffer belongs
// to the calling thread and only grows, so a training loop stops allocating after its first
// step; OpenMP workers inside the kernel may use the pointer the caller obtained.
#pragma once

#include <cstddef>
#include <vector>

namespace loom::cpu {

// At least n elements of T, valid until the calling thread's next thread_scratch<T>() call.
template <typename T = float>
T* thread_scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace loom::cpu
