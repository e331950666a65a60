#include "rl/weight_sync.h"

#include <algorithm>
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

int64_t weight_payload_bytes(int64_t numel, DType dtype) {
  check_dtype(dtype);
  return numel * int64_t(dtype_size(dtype));
}

// The parameters may live in device memory: each function stages them through the host in
// chunks small enough to stay in cache (ParamSet::read_values / write_values), so no second copy
// of the model is made and the CPU path pays one cache-hot memcpy per chunk.
constexpr int64_t kChunk = 4096;

WeightMessage pack_weights(const ParamSet& P, DType dtype, int64_t version) {
  const int64_t n = P.total();
  WeightMessage msg;
  msg.version = version;
  msg.payload.resize(size_t(weight_payload_bytes(n, dtype)));
  if (dtype == DType::F32) {
    P.read_values(0, n, reinterpret_cast<float*>(msg.payload.data()));
  } else {
    uint16_t* h = reinterpret_cast<uint16_t*>(msg.payload.data());
    float w[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      P.read_values(i, i + m, w);
      for (int64_t k = 0; k < m; ++k) h[i + k] = f32_to_bf16(w[k]);
    }
  }
  return msg;
}

int64_t unpack_weights(const WeightMessage& msg, DType dtype, ParamSet& P) {
  const int64_t n = P.total();
  LOOM_CHECK(int64_t(msg.payload.size()) == weight_payload_bytes(n, dtype), "a weight message of ",
             msg.payload.size(), " bytes does not hold the model's ", n, " ", dtype_name(dtype),
             " parameters (", weight_payload_bytes(n, dtype), " bytes)");
  const int64_t version = msg.version;
  LOOM_CHECK(version >= 0, "a weight message carries the negative version ", version);
  if (dtype == DType::F32) {
    P.write_values(0, n, reinterpret_cast<const float*>(msg.payload.data()));
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(msg.payload.data());
    float w[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      for (int64_t k = 0; k < m; ++k) w[k] = bf16_to_f32(h[i + k]);
      P.write_values(i, i + m, w);
    }
  }
  return version;
}

uint64_t weights_hash(const ParamSet& P, DType dtype) {
  check_dtype(dtype);
  uint64_t h = 14695981039346656037ull;
  // Converted as pack_weights converts them.
  float w[kChunk];
  uint16_t half[kChunk];
  for (int64_t i = 0; i < P.total(); i += kChunk) {
    const int64_t m = std::min(kChunk, P.total() - i);
    P.read_values(i, i + m, w);
    if (dtype == DType::F32) {
      h = fnv1a(reinterpret_cast<const uint8_t*>(w), size_t(m) * 4, h);
    } else {
      for (int64_t k = 0; k < m; ++k) half[k] = f32_to_bf16(w[k]);
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
