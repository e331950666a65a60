// Word-at-a-time byte tests ("SIMD within a register"): eight bytes of text held in a
// uint64_t, first byte in the lowest lane; each test sets the high bit of the lanes that match,
// exactly (no carry crosses a lane). The text scanners of the JSON writer and parser and of
// curation find the next byte that needs work this way and copy or skip the rest in bulk.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace loom::swar {

static_assert(std::endian::native == std::endian::little, "lanes are read little-endian");

inline constexpr uint64_t kOnes = 0x0101010101010101ULL, kHigh = 0x8080808080808080ULL;

inline uint64_t load8(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// Lanes equal to c.
constexpr uint64_t equal(uint64_t w, unsigned char c) {
  uint64_t z = w ^ (kOnes * c);
  return ~(((z & ~kHigh) + ~kHigh) | z) & kHigh;
}

// Lanes below c, for c <= 0x80.
constexpr uint64_t below(uint64_t w, unsigned char c) {
  return ~(((w & ~kHigh) | kHigh) - kOnes * c) & ~w & kHigh;
}

// Lanes with lo <= byte <= hi, both below 0x80 (0x7F + 0x80 - lo stays below 0x100).
constexpr uint64_t ascii_in_range(uint64_t w, unsigned char lo, unsigned char hi) {
  uint64_t low7 = w & ~kHigh;
  return (low7 + kOnes * (0x80u - lo)) & ~(low7 + kOnes * (0x7Fu - hi)) & ~w & kHigh;
}

// Index of the first lane set in a non-zero mask.
constexpr size_t first(uint64_t mask) {
  return static_cast<size_t>(std::countr_zero(mask)) / 8;
}

}  // namespace loom::swar
