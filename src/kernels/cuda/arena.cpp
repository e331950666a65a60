#include "kernels/cuda/arena.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace loom {
namespace {

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

void* BumpRegion::take(size_t bytes, const char* what) {
  const size_t n = align_up(bytes, kAlign);
  LOOM_CHECK(n <= capacity_ - used_, "device memory class '", name_, "' is full: ", what, " needs ",
             bytes, " bytes, ", capacity_ - used_, " of ", capacity_,
             " are free (plan a larger class)");
  void* p = base_ + used_;
  used_ += n;
  peak_ = std::max(peak_, used_);
  return p;
}

void BumpRegion::release(size_t mark) {
  LOOM_CHECK(mark <= used_, "device memory class '", name_, "': release to ", mark,
             " beyond the used ", used_, " bytes");
  used_ = mark;
}

DeviceArena::~DeviceArena() {
  for (Class& c : classes_)
    if (c.committed && c.region.base() && free_) free_(c.region.base());
}

DeviceArena& DeviceArena::operator=(DeviceArena&& o) noexcept {
  if (this != &o) {
    for (Class& c : classes_)
      if (c.committed && c.region.base() && free_) free_(c.region.base());
    alloc_ = std::move(o.alloc_);
    free_ = std::move(o.free_);
    classes_ = std::move(o.classes_);
    allocations_ = o.allocations_;
    o.classes_.clear();
    o.allocations_ = 0;
  }
  return *this;
}

DeviceArena::Class* DeviceArena::find(const std::string& cls) {
  for (Class& c : classes_)
    if (c.name == cls) return &c;
  return nullptr;
}
const DeviceArena::Class* DeviceArena::find(const std::string& cls) const {
  for (const Class& c : classes_)
    if (c.name == cls) return &c;
  return nullptr;
}

void DeviceArena::reserve(const std::string& cls, size_t bytes) {
  Class* c = find(cls);
  if (!c) {
    classes_.push_back(Class{cls, 0, false, {}});
    c = &classes_.back();
  }
  LOOM_CHECK(!c->committed, "device memory class '", cls,
             "' is already allocated: reserve all of it before commit()");
  c->planned += align_up(bytes, BumpRegion::kAlign);
}

BumpRegion& DeviceArena::commit(const std::string& cls) {
  Class* c = find(cls);
  LOOM_CHECK(c, "device memory class '", cls, "' was never reserved");
  LOOM_CHECK(!c->committed, "device memory class '", cls, "' is committed twice");
  LOOM_CHECK(alloc_, "DeviceArena has no allocator");
  void* p = nullptr;
  if (c->planned > 0) {
    p = alloc_(c->planned);
    LOOM_CHECK(p, "out of device memory allocating class '", cls, "' (", mib(c->planned), ")");
    ++allocations_;
  }
  c->committed = true;
  c->region = BumpRegion(cls, p, c->planned);
  return c->region;
}

BumpRegion& DeviceArena::create(const std::string& cls, size_t bytes) {
  reserve(cls, bytes);
  return commit(cls);
}

bool DeviceArena::has(const std::string& cls) const {
  return find(cls) != nullptr;
}

BumpRegion& DeviceArena::region(const std::string& cls) {
  Class* c = find(cls);
  LOOM_CHECK(c && c->committed, "device memory class '", cls, "' is not allocated");
  return c->region;
}

size_t DeviceArena::planned(const std::string& cls) const {
  const Class* c = find(cls);
  return c ? c->planned : 0;
}

size_t DeviceArena::total_capacity() const {
  size_t t = 0;
  for (const Class& c : classes_) t += c.committed ? c.region.capacity() : 0;
  return t;
}

size_t DeviceArena::total_peak() const {
  size_t t = 0;
  for (const Class& c : classes_) t += c.committed ? c.region.peak() : 0;
  return t;
}

std::string DeviceArena::report() const {
  std::string s;
  for (const Class& c : classes_) {
    if (!c.committed) continue;
    s += cat("  ", c.name, ": ", mib(c.region.capacity()), " allocated, peak ",
             mib(c.region.peak()), "\n");
  }
  s += cat("  total: ", mib(total_capacity()), " allocated in ", allocations_,
           " allocations, peak ", mib(total_peak()), "\n");
  return s;
}

}  // namespace loom
