// A regular expression over bytes as a tree (byte sets, sequences, alternatives, bounded or
// unbounded repetition): what the regex parser and the JSON Schema compiler produce and the
// byte automaton (byte_dfa.h) is built from. Characters enter as code-point ranges and are
// written as their UTF-8 byte sequences, so every string the tree matches is valid UTF-8 when
// its character sets are.
#pragma once

#include <bitset>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::infer::constrain {

struct Rx {
  enum class Kind { Set, Seq, Alt, Rep };
  Kind kind = Kind::Seq;   // an empty Seq matches the empty string
  std::bitset<256> bytes;  // Set
  std::vector<Rx> kids;    // Seq, Alt; Rep: one
  int min = 0, max = 0;    // Rep: max < 0 is unbounded
};

Rx rx_byte_range(unsigned char lo, unsigned char hi);
Rx rx_literal(std::string_view bytes);
Rx rx_seq(std::vector<Rx> parts);
Rx rx_alt(std::vector<Rx> choices);
Rx rx_rep(Rx r, int min, int max);  // max < 0: unbounded
inline Rx rx_opt(Rx r) {
  return rx_rep(std::move(r), 0, 1);
}
inline Rx rx_star(Rx r) {
  return rx_rep(std::move(r), 0, -1);
}
inline Rx rx_empty() {
  return Rx{};
}

// Inclusive code-point ranges.
using CpRanges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
// Sorted, merged, clipped to [0, 0x10FFFF].
CpRanges cp_normalize(CpRanges r);
CpRanges cp_negate(const CpRanges& r);  // the complement within [0, 0x10FFFF]
// The UTF-8 encodings of the ranges' characters (surrogates U+D800..U+DFFF left out).
Rx rx_utf8(const CpRanges& r);

}  // namespace loom::infer::constrain
