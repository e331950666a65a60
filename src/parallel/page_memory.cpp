#include "parallel/page_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace loom::parallel {

static int64_t page_size() {
  static const int64_t p = sysconf(_SC_PAGESIZE);
  return p;
}

void release_memory(float* p, int64_t n) {
  if (n <= 0) return;
  const uintptr_t page = page_size();
  uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + uintptr_t(n) * sizeof(float);
  uintptr_t a = (begin + page - 1) / page * page, b = end / page * page;
  if (a >= b) {
    std::memset(p, 0, n * sizeof(float));
    return;
  }
  std::memset(p, 0, a - begin);
  std::memset(reinterpret_cast<void*>(b), 0, end - b);
  // Private anonymous memory reads back as zeros after MADV_DONTNEED: freed and zeroed at once.
  if (madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(a), 0, b - a);
}

void release_memory(Backend& be, float* p, int64_t n) {
  if (n <= 0) return;
  if (be.host_accessible()) return release_memory(p, n);
  be.fill_bytes(p, 0, size_t(n) * sizeof(float));
}

int64_t resident_bytes(const void* p, int64_t bytes) {
  if (!p || bytes <= 0) return 0;
  const uintptr_t page = page_size();
  uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  uintptr_t a = begin / page * page, b = (end + page - 1) / page * page;
  std::vector<unsigned char> vec((b - a) / page);
  if (mincore(reinterpret_cast<void*>(a), b - a, vec.data()) != 0) return bytes;
  int64_t total = 0;
  for (size_t i = 0; i < vec.size(); ++i) {
    if (!(vec[i] & 1)) continue;
    uintptr_t lo = std::max(begin, a + i * page), hi = std::min(end, a + (i + 1) * page);
    total += static_cast<int64_t>(hi - lo);
  }
  return total;
}

}  // namespace loom::parallel
