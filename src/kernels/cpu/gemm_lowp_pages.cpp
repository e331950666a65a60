#include "kernels/cpu/gemm_lowp_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>
#include <utility>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack it (older kernels answer EINVAL)
#endif

namespace loom::cpu {
namespace {

constexpr size_t kHuge = size_t(2) << 20;

}  // namespace

size_t use_huge_pages(void* p, size_t bytes) {
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (p == nullptr || e <= b) return 0;
  void* start = reinterpret_cast<void*>(b);
  if (madvise(start, e - b, MADV_HUGEPAGE) != 0) return 0;
  // Collapse fails (EAGAIN, ENOMEM) where huge pages are short; the advice above still lets
  // khugepaged collapse the range later.
  return madvise(start, e - b, MADV_COLLAPSE) == 0 ? e - b : 0;
}

HugeBuffer::HugeBuffer(size_t bytes, bool huge) : bytes_(bytes) {
  if (bytes == 0) return;
  // Mapped with a huge page to spare, then trimmed to a 2 MiB-aligned start (mmap aligns to 4 KiB
  // only); a fresh anonymous mapping is zero-filled.
  const size_t len = (bytes + kHuge - 1) / kHuge * kHuge;
  void* raw =
      mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t a = (r + kHuge - 1) & ~(kHuge - 1);
  if (a > r) munmap(raw, a - r);
  if (a + len < r + len + kHuge)
    munmap(reinterpret_cast<void*>(a + len), r + len + kHuge - (a + len));
  p_ = reinterpret_cast<void*>(a);
  mapped_ = len;
  if (huge) madvise(p_, len, MADV_HUGEPAGE);  // a hint: refused, the pages are 4 KiB ones
}

HugeBuffer::~HugeBuffer() {
  if (p_ != nullptr) munmap(p_, mapped_);
}

HugeBuffer::HugeBuffer(HugeBuffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      mapped_(std::exchange(o.mapped_, 0)) {}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) munmap(p_, mapped_);
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

}  // namespace loom::cpu
