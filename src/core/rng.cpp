#include "core/rng.h"

#include <cmath>

namespace loom {

uint64_t name_key(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::array<uint32_t, 4> philox(uint64_t seed, uint64_t key, uint64_t ctr) {
  // Key = seed mixed with the stream key; counter = (ctr, stream key) so streams never collide.
  uint64_t k64 = seed ^ (key * 0x9E3779B97F4A7C15ull);
  uint32_t k0 = static_cast<uint32_t>(k64), k1 = static_cast<uint32_t>(k64 >> 32);
  uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32);
  uint32_t c2 = static_cast<uint32_t>(key), c3 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

static float to_unit(uint32_t x) {
  return (x >> 8) * (1.0f / 16777216.0f);
}

float uniform_at(uint64_t seed, uint64_t key, uint64_t index) {
  return to_unit(philox(seed, key, index)[0]);
}

float normal_at(uint64_t seed, uint64_t key, uint64_t index) {
  auto r = philox(seed, key, index);
  // Box-Muller on two words; u1 in (0, 1] so the log is finite.
  double u1 = ((r[0] >> 8) + 1.0) / 16777216.0;
  double u2 = (r[1] >> 8) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t key, uint64_t first, float mean,
                 float std) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = mean + std * normal_at(seed, key, first + i);
}

}  // namespace loom
