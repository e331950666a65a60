// Counter-based randomness (Philox-4x32-10). A value depends only on (seed, stream key,
// element index), never on call order or how a tensor is sharded: a rank holding elements
// [off, off+n) of a parameter draws exactly what one process draws for those elements.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace loom {

// Stable 64-bit key for a name (FNV-1a), e.g. a parameter's name.
uint64_t name_key(std::string_view name);

// Four 32-bit random words for counter `ctr` under (seed, key).
std::array<uint32_t, 4> philox(uint64_t seed, uint64_t key, uint64_t ctr);

// Uniform in [0, 1) and standard normal for element `index` of stream (seed, key).
float uniform_at(uint64_t seed, uint64_t key, uint64_t index);
float normal_at(uint64_t seed, uint64_t key, uint64_t index);

// Fills out[i] = mean + std * normal_at(seed, key, first + i).
void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t key, uint64_t first, float mean,
                 float std);

}  // namespace loom
