// Huge (2 MiB) pages for what single-stream decode streams from memory every token: the weights
// (124-500 MB for gpt2-124m) and the paged KV pool. With 4 KiB pages a streaming read takes a
// TLB miss every 4 KiB and the hardware prefetchers stop at every page boundary; a 2 MiB page
// has neither every 4 KiB. Transparent huge pages are often enabled only for memory that asks
// (/sys/kernel/mm/transparent_hugepage/enabled = madvise), so this asks. Everything here is a
// hint: where the kernel refuses (no THP, an old kernel, no free huge pages), memory stays on
// 4 KiB pages and works the same, only slower.
#pragma once

#include <cstddef>

namespace loom::cpu {

// Asks for huge pages over the 2 MiB-aligned part of [p, p + bytes) of anonymous memory already
// mapped (e.g. a model's parameter buffer): MADV_HUGEPAGE for pages faulted later, then
// MADV_COLLAPSE (Linux 6.1+) to move what is already there into huge pages now, contents kept.
// Returns the bytes collapsed into huge pages (0 where the kernel refused or the range holds no
// whole aligned 2 MiB).
size_t use_huge_pages(void* p, size_t bytes);

// A zero-filled allocation aligned to 2 MiB whose pages are asked to be huge before first touch
// (so the first write faults huge pages in, with no collapse afterwards); `huge` false leaves
// the default page size (benchmarks compare the two). Move-only.
class HugeBuffer {
 public:
  HugeBuffer() = default;
  explicit HugeBuffer(size_t bytes, bool huge = true);
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& o) noexcept;
  HugeBuffer& operator=(HugeBuffer&& o) noexcept;
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  void* data() const { return p_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0, mapped_ = 0;
};

}  // namespace loom::cpu
