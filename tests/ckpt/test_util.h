// Helpers shared by the checkpoint tests: scratch directories and tensor comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "core/tensor.h"
#include "temp_dir.h"

namespace loom::ckpt::testing {

// A fresh directory removed when the test ends: the shared helper (tests/temp_dir.h).
class ScratchDir : public loom::test::TempDir {
 public:
  ScratchDir() : loom::test::TempDir("ckpt") {}
  const std::string& path() const { return loom::test::TempDir::path; }
};

// Random values of the tensor's dtype: every byte pattern for integer types, and for float
// types values of that precision (so a conversion to fp32 and back is exact).
inline Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor t = Tensor::zeros(shape, dtype);
  if (dtype == DType::F32) {
    std::normal_distribution<float> nd(0.f, 1.f);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = nd(rng);
  } else {
    auto* p = static_cast<uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
    if (dtype == DType::BF16 || dtype == DType::F16) {  // keep values finite and non-NaN
      auto* h = t.data<uint16_t>();
      for (int64_t i = 0; i < t.numel(); ++i) h[i] &= 0xbfffu;
    }
  }
  return t;
}

// Byte-exact equality of shape, dtype and contents (logical order).
inline ::testing::AssertionResult same_tensor(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure()
           << "shapes " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  if (a.dtype() != b.dtype())
    return ::testing::AssertionFailure()
           << "dtypes " << dtype_name(a.dtype()) << " vs " << dtype_name(b.dtype());
  Tensor ca = a.is_contiguous() ? a : a.clone(), cb = b.is_contiguous() ? b : b.clone();
  if (a.nbytes() && std::memcmp(ca.raw(), cb.raw(), a.nbytes()) != 0)
    return ::testing::AssertionFailure() << "contents differ";
  return ::testing::AssertionSuccess();
}

// The message of the loom::Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Corrupts `count` distinct bytes of a safetensors file's data buffer in place (bit-inverted, at
// seeded positions), as a bad disk or a stray write would: the file keeps its size.
inline void flip_data_bytes(const std::string& path, int count, uint32_t seed) {
  std::string bytes = read_file(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const uint64_t begin = 8 + header;
  ASSERT_GE(bytes.size(), begin + count) << path;
  std::mt19937_64 rng(seed);
  std::set<uint64_t> at;
  while (at.size() < static_cast<size_t>(count)) at.insert(begin + rng() % (bytes.size() - begin));
  for (uint64_t i : at) bytes[i] = static_cast<char>(~bytes[i]);
  std::ofstream out(path, std::ios::binary | std::ios::in | std::ios::out);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

}  // namespace loom::ckpt::testing
