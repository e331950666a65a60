#include "rl/weight_sync.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace loom::rl {

namespace {

void check_dtype(DType dtype) {
  LOOM_CHECK(dtype == DType::F32 || dtype == DType::BF16,
             "weight sync sends fp32 or bf16 weights, not ", dtype_name(dtype));
}

// FNV-1a 64, byte by byte: a fixed, portable hash (the test compares it across processes).
uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

int64_t weight_message_bytes(int64_t numel, DType dtype) {
  check_dtype(dtype);
  return 8 + numel * int64_t(dtype_size(dtype));
}

std::vector<uint8_t> pack_weights(const ParamSet& P, DType dtype, int64_t version) {
  const int64_t n = P.total();
  std::vector<uint8_t> msg(size_t(weight_message_bytes(n, dtype)));
  std::memcpy(msg.data(), &version, 8);
  const float* w = P.data();
  if (dtype == DType::F32) {
    std::memcpy(msg.data() + 8, w, size_t(n) * 4);
  } else {
    uint16_t* h = reinterpret_cast<uint16_t*>(msg.data() + 8);
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(w[i]);
  }
  return msg;
}

int64_t unpack_weights(const std::vector<uint8_t>& msg, DType dtype, ParamSet& P) {
  const int64_t n = P.total();
  LOOM_CHECK(int64_t(msg.size()) == weight_message_bytes(n, dtype), "a weight message of ",
             msg.size(), " bytes does not hold the model's ", n, " ", dtype_name(dtype),
             " parameters (", weight_message_bytes(n, dtype), " bytes)");
  int64_t version = 0;
  std::memcpy(&version, msg.data(), 8);
  LOOM_CHECK(version >= 0, "a weight message carries the negative version ", version);
  float* w = P.data();
  if (dtype == DType::F32) {
    std::memcpy(w, msg.data() + 8, size_t(n) * 4);
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(msg.data() + 8);
    for (int64_t i = 0; i < n; ++i) w[i] = bf16_to_f32(h[i]);
  }
  return version;
}

uint64_t weights_hash(const ParamSet& P, DType dtype) {
  check_dtype(dtype);
  const float* w = P.data();
  uint64_t h = 14695981039346656037ull;
  // In chunks, converted as pack_weights converts them, so no second copy of the model is made.
  uint16_t half[4096];
  for (int64_t i = 0; i < P.total(); i += 4096) {
    const int64_t m = std::min<int64_t>(4096, P.total() - i);
    if (dtype == DType::F32) {
      h = fnv1a(reinterpret_cast<const uint8_t*>(w + i), size_t(m) * 4, h);
    } else {
      for (int64_t k = 0; k < m; ++k) half[k] = f32_to_bf16(w[i + k]);
      h = fnv1a(reinterpret_cast<const uint8_t*>(half), size_t(m) * 2, h);
    }
  }
  return h;
}

DType weight_sync_dtype(const std::string& name) {
  if (name == "f32" || name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  fail("--weight-sync must be f32 or bf16, not '", name, "'");
}

}  // namespace loom::rl
