// Bit-for-bit equality of two float vectors, the comparison every "bit-identical" test makes.
// Empty vectors may hold null data pointers, which memcmp must not be given (UBSan rejects it).
#pragma once

#include <cstring>
#include <vector>

namespace loom::test {

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace loom::test
