// Helpers of the GPU tests: a shared CudaBackend (or a skip when there is no device), device
// buffers, NaN poisoning, and a CPU-vs-GPU comparison in which NaN never passes.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace loom::test {

// One backend for the whole test binary; nullptr without a device.
inline CudaBackend* gpu() {
  static std::unique_ptr<CudaBackend> be = [] {
    std::unique_ptr<CudaBackend> b;
    if (cuda_device_count() > 0) {
      CudaOptions o;
      o.gemm_math = GemmMath::FP32;
      b = std::make_unique<CudaBackend>(o);
    }
    return b;
  }();
  return be.get();
}

#define LOOM_REQUIRE_GPU()                                                \
  do {                                                                    \
    if (::loom::test::gpu() == nullptr) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// A device buffer (cudaMalloc'd: tests may allocate; the backend itself never does per op).
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : bytes_(bytes) {
    if (bytes && cudaMalloc(&p_, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  template <typename T>
  explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size() * sizeof(T)) {
    gpu()->upload(p_, host.data(), bytes_);
  }
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  float* f() const { return static_cast<float*>(p_); }
  int32_t* i() const { return static_cast<int32_t*>(p_); }
  void* raw() const { return p_; }
  size_t bytes() const { return bytes_; }
  // Every float becomes NaN (0xFFFFFFFF): an output the op forgets to write cannot pass.
  void poison() { gpu()->fill_bytes(p_, 0xFF, bytes_); }
  template <typename T = float>
  std::vector<T> get() const {
    std::vector<T> h(bytes_ / sizeof(T));
    gpu()->download(h.data(), p_, bytes_);
    return h;
  }
  template <typename T>
  void set(const std::vector<T>& h) {
    gpu()->upload(p_, h.data(), std::min(bytes_, h.size() * sizeof(T)));
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

inline std::vector<float> nan_vector(size_t n) {
  return std::vector<float>(n, std::nanf(""));
}

// |gpu - cpu| <= atol + rtol * |cpu| element by element; a NaN on the GPU side fails unless
// the CPU value is NaN too (a poisoned output never written stays NaN and fails).
inline ::testing::AssertionResult close(const std::vector<float>& g, const std::vector<float>& c,
                                        double rtol, double atol) {
  if (g.size() != c.size())
    return ::testing::AssertionFailure() << "size " << g.size() << " vs " << c.size();
  size_t worst = 0, bad = 0;
  double worst_err = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool gn = std::isnan(g[i]), cn = std::isnan(c[i]);
    double err;
    if (gn || cn) {
      err = gn && cn ? 0.0 : INFINITY;
    } else {
      err = std::fabs(double(g[i]) - c[i]) - (atol + rtol * std::fabs(double(c[i])));
    }
    if (err > 0) ++bad;
    if (err > worst_err) {
      worst_err = err;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << g.size() << " elements differ; worst at " << worst << ": gpu "
         << g[worst] << " cpu " << c[worst] << " (rtol " << rtol << ", atol " << atol << ")";
}

// Tolerance relative to the largest magnitude of the reference (GEMM-like sums).
inline ::testing::AssertionResult close_scaled(const std::vector<float>& g,
                                               const std::vector<float>& c, double rel) {
  double m = 0;
  for (float x : c)
    if (std::isfinite(x)) m = std::max(m, double(std::fabs(x)));
  return close(g, c, 0.0, rel * std::max(m, 1e-30));
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace loom::test
