// A deterministic automaton over bytes built from a byte regex (Thompson's construction, then
// the subset construction over classes of bytes that no set tells apart). States that cannot
// reach an accepting state are removed, so every live state can still complete a match.
#pragma once

#include <cstdint>
#include <vector>

#include "infer/constrain/byte_regex.h"

namespace loom::infer::constrain {

class ByteDfa {
 public:
  // Throws loom::Error when the automaton would pass `max_states` states (the constraint is
  // too large for a grammar of this kind).
  static ByteDfa build(const Rx& rx, int max_states = 20000);

  static constexpr int kDead = -1;
  int start() const { return start_; }  // kDead when the regex matches nothing
  int num_states() const { return static_cast<int>(accepting_.size()); }
  int next(int state, unsigned char byte) const { return next_[size_t(state) * 256 + byte]; }
  bool accepting(int state) const { return accepting_[size_t(state)] != 0; }
  // Runs bytes from state; kDead if they leave the language.
  int walk(int state, const char* bytes, size_t n) const;
  bool matches(const std::string& s) const;

 private:
  int start_ = kDead;
  std::vector<int32_t> next_;  // [state * 256 + byte]
  std::vector<uint8_t> accepting_;
};

}  // namespace loom::infer::constrain
