// Backend memory operations (alloc / free by buffer class, copies, fill, the weighted sum) on
// the CPU backend, BackendBuffer's ownership, and the guarded test backend's protection.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/guarded_backend.h"

using namespace loom;

namespace {

// The MiB figure memory_report prints for a class's held bytes ("<cls> <held> MiB held").
double held_mib(const Backend& be, const std::string& cls) {
  const std::string r = be.memory_report();
  const size_t at = r.find(" " + cls + " ");
  if (at == std::string::npos) return -1;
  return std::stod(r.substr(at + cls.size() + 2));
}

}  // namespace

TEST(BackendMemory, CpuAllocIsAlignedAndAccountedByClass) {
  Backend& be = cpu_backend();
  const double before = std::max(0.0, held_mib(be, "memtest-a"));
  void* a = be.alloc(3 << 20, "memtest-a");
  void* b = be.alloc(1, "memtest-a");
  void* z = be.alloc(0, "memtest-a");
  for (void* p : {a, b, z}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Backend::kAlign, 0u);
  EXPECT_NE(z, nullptr);
  EXPECT_NE(z, b);
  EXPECT_NEAR(held_mib(be, "memtest-a") - before, 3.0, 0.01);
  be.free(a);
  be.free(b);
  be.free(z);
  be.free(nullptr);
  EXPECT_NEAR(held_mib(be, "memtest-a"), before, 0.01);
  // A pointer the backend did not hand out is an error, not heap corruption.
  int x = 0;
  EXPECT_THROW(be.free(&x), Error);
}

TEST(BackendMemory, CopiesAndFillRoundTrip) {
  Backend& be = cpu_backend();
  std::vector<float> host(1000), back(1000, -1.f);
  for (size_t i = 0; i < host.size(); ++i) host[i] = normal_at(3, 1, i);
  BackendBuffer d1(be, host.size() * 4, "memtest"), d2(be, host.size() * 4, "memtest");
  be.copy_h2d(d1.data(), host.data(), host.size() * 4);
  be.copy_d2d(d2.data(), d1.data(), host.size() * 4);
  be.fill_bytes(d1.data(), 0, host.size() * 4);
  be.copy_d2h(back.data(), d2.data(), host.size() * 4);
  be.sync();
  EXPECT_EQ(std::memcmp(back.data(), host.data(), host.size() * 4), 0);
  be.copy_d2h(back.data(), d1.data(), host.size() * 4);
  for (float v : back) ASSERT_EQ(v, 0.f);
}

// A fill large enough to be split over the OpenMP team (chunks of 1 MiB), starting and ending
// off a chunk boundary, under one and two threads: every byte inside set, none outside.
TEST(BackendMemory, LargeFillSetsExactlyItsRange) {
  Backend& be = cpu_backend();
  const size_t total = (size_t(5) << 20) + 4096, begin = 37, bytes = total - begin - 1001;
  std::vector<unsigned char> buf(total);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int byte : {0xab, 0x00}) {
      std::fill(buf.begin(), buf.end(), static_cast<unsigned char>(0x5c));
      be.fill_bytes(buf.data() + begin, byte, bytes);
      for (size_t i = 0; i < total; ++i) {
        const bool inside = i >= begin && i < begin + bytes;
        ASSERT_EQ(buf[i], inside ? byte : 0x5c) << "byte " << i << ", " << threads << " threads";
      }
    }
  }
  set_num_threads(saved);
}

// Pages of [p, p + bytes) resident in memory (mincore).
int64_t resident_pages(const void* p, size_t bytes) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> vec((b - a) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(a), b - a, vec.data()), 0);
  int64_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

// The CPU backend's zeroed buffers (parameters, gradients) are fresh pages: zeros that take no
// memory until written, so a ZeRO-3 rank pays only for the part it initialises.
TEST(BackendMemory, CpuAllocZeroedIsLazyZerosAccountedAndFreed) {
  Backend& be = cpu_backend();
  const double before = std::max(0.0, held_mib(be, "memtest-z"));
  const size_t bytes = 8 << 20;
  auto* p = static_cast<float*>(be.alloc_zeroed(bytes, "memtest-z"));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Backend::kAlign, 0u);
  EXPECT_NEAR(held_mib(be, "memtest-z") - before, 8.0, 0.01);
  EXPECT_EQ(resident_pages(p, bytes), 0);
  p[12345] = 1.f;  // host memory: writable in place, one page made resident
  EXPECT_GE(resident_pages(p, bytes), 1);
  EXPECT_LT(resident_pages(p, bytes), 8);
  std::vector<float> back(bytes / 4, -1.f);
  be.copy_d2h(back.data(), p, bytes);
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], i == 12345 ? 1.f : 0.f) << i;
  be.free(p);
  EXPECT_NEAR(held_mib(be, "memtest-z"), before, 0.01);
  void* z = be.alloc_zeroed(0, "memtest-z");  // a distinct, freeable pointer
  EXPECT_NE(z, nullptr);
  be.free(z);
  EXPECT_THROW(be.free(z), Error);  // freed once only
}

// Elsewhere alloc_zeroed is alloc then fill_bytes (the Backend default, as on CUDA): zeros too.
TEST(BackendMemory, DefaultAllocZeroedFillsWithZeros) {
  test::GuardedBackend be;
  const size_t n = 5000;
  std::vector<float> back(n, -1.f);
  const int64_t ops = be.ops();
  BackendBuffer z = BackendBuffer::zeroed(be, n * 4, "memtest");
  EXPECT_EQ(z.bytes(), n * 4);
  EXPECT_EQ(z.backend(), &be);
  be.copy_d2h(back.data(), z.data(), n * 4);
  for (float v : back) ASSERT_EQ(v, 0.f);
  // Its fresh mappings are zeros anyway: the fill (an op) is what shows the default ran.
  EXPECT_EQ(be.ops(), ops + 2);  // fill_bytes, copy_d2h
}

TEST(BackendMemory, WeightedSumIsTheSequentialDoubleSum) {
  Backend& be = cpu_backend();
  const int64_t n = 4099;
  std::vector<float> x(n), w(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = 1e4f * normal_at(5, 1, i);
    w[i] = normal_at(5, 2, i);
  }
  double plain = 0, weighted = 0;
  for (int64_t i = 0; i < n; ++i) {
    plain += x[i];
    weighted += double(w[i]) * x[i];
  }
  BackendBuffer dx(be, n * 4, "memtest"), dw(be, n * 4, "memtest");
  be.copy_h2d(dx.data(), x.data(), n * 4);
  be.copy_h2d(dw.data(), w.data(), n * 4);
  EXPECT_EQ(be.weighted_sum(dx.as<float>(), nullptr, n), plain);
  EXPECT_EQ(be.weighted_sum(dx.as<float>(), dw.as<float>(), n), weighted);
  EXPECT_EQ(be.weighted_sum(dx.as<float>(), dw.as<float>(), 0), 0.0);
}

TEST(BackendMemory, BufferFreesOnceAndMovesOwnership) {
  test::GuardedBackend be;  // counts live buffers exactly
  {
    BackendBuffer a(be, 100, "memtest");
    EXPECT_EQ(be.live_buffers(), 1u);
    BackendBuffer b = std::move(a);
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(b.bytes(), 100u);
    EXPECT_EQ(b.backend(), &be);
    BackendBuffer c(be, 10, "memtest");
    c = std::move(b);  // c's old buffer is freed
    EXPECT_EQ(be.live_buffers(), 1u);
    void* p = c.ensure(be, 50, "memtest");  // fits: kept
    EXPECT_EQ(p, c.data());
    EXPECT_EQ(c.bytes(), 100u);
    c.ensure(be, 5000, "memtest");  // grows: a new buffer, the old one freed
    EXPECT_EQ(c.bytes(), 5000u);
    EXPECT_EQ(be.live_buffers(), 1u);
  }
  EXPECT_EQ(be.live_buffers(), 0u);
}

// The guard itself: ops see the buffers, host code outside an op faults. Without this the
// device-agnostic model test (tests/model/device_agnostic_test.cpp) could pass vacuously.
TEST(GuardedBackend, OpsSeeBuffersHostAccessFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  test::GuardedBackend be;
  const int n = 64;
  std::vector<float> host(n, 2.f), back(n);
  BackendBuffer x(be, n * 4, "memtest");
  be.copy_h2d(x.data(), host.data(), n * 4);
  be.scale_inplace(x.as<float>(), 3.f, n);
  be.copy_d2h(back.data(), x.data(), n * 4);
  for (float v : back) ASSERT_EQ(v, 6.f);
  EXPECT_EQ(be.sum_squares(x.as<float>(), n), 36.0 * n);
  EXPECT_GE(be.ops(), 4);
  EXPECT_DEATH(
      {
        test::GuardedBackend g;
        float* p = static_cast<float*>(g.alloc(16, "memtest"));
        p[0] = 1.f;  // a host write outside any op
      },
      "");
  EXPECT_DEATH(
      {
        test::GuardedBackend g;
        BackendBuffer b(g, 16, "memtest");
        g.fill_bytes(b.data(), 0, 16);
        volatile float v = b.as<float>()[1];  // a host read after the op returned
        (void)v;
      },
      "");
}

// Strict mode: an op given host memory (not a backend buffer, not a declared host range) is
// recorded, as a GPU could not read it.
TEST(GuardedBackend, StrictModeRecordsHostPointersGivenToOps) {
  test::GuardedBackend be;
  be.set_strict(true);
  const int n = 8;
  BackendBuffer a(be, n * 4, "memtest"), b(be, n * 4, "memtest");
  std::vector<float> host(n, 1.f), params(n, 2.f);
  be.add(a.as<float>(), b.as<float>(), a.as<float>() + 4, 4);  // interior pointers are fine
  EXPECT_TRUE(be.host_pointer_ops().empty());
  be.add_inplace(a.as<float>(), host.data(), n);
  ASSERT_EQ(be.host_pointer_ops().size(), 1u);
  EXPECT_EQ(be.host_pointer_ops()[0], "add_inplace");
  be.allow_host(params.data(), params.size() * 4);
  be.add_inplace(a.as<float>(), params.data() + 3, 1);
  be.copy_h2d(b.data(), host.data(), n * 4);  // a host source is what copy_h2d is for
  EXPECT_EQ(be.host_pointer_ops().size(), 1u);
  be.copy_d2h(host.data(), host.data(), 4);  // but its device side must be a buffer
  EXPECT_EQ(be.host_pointer_ops().size(), 2u);
}
