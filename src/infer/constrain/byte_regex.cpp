#include "infer/constrain/byte_regex.h"

#include <algorithm>
#include <string>

#include "core/utf8.h"

namespace loom::infer::constrain {

Rx rx_byte_range(unsigned char lo, unsigned char hi) {
  Rx r;
  r.kind = Rx::Kind::Set;
  for (int b = lo; b <= hi; ++b) r.bytes.set(size_t(b));
  return r;
}

Rx rx_literal(std::string_view bytes) {
  Rx r;
  for (unsigned char c : bytes) r.kids.push_back(rx_byte_range(c, c));
  return r;
}

Rx rx_seq(std::vector<Rx> parts) {
  Rx r;
  for (Rx& p : parts) {
    if (p.kind == Rx::Kind::Seq)  // flatten: fewer empty transitions in the automaton
      for (Rx& k : p.kids) r.kids.push_back(std::move(k));
    else
      r.kids.push_back(std::move(p));
  }
  if (r.kids.size() == 1) return std::move(r.kids[0]);
  return r;
}

Rx rx_alt(std::vector<Rx> choices) {
  if (choices.size() == 1) return std::move(choices[0]);
  Rx r;
  r.kind = Rx::Kind::Alt;
  r.kids = std::move(choices);
  return r;
}

Rx rx_rep(Rx x, int min, int max) {
  if (min == 1 && max == 1) return x;
  Rx r;
  r.kind = Rx::Kind::Rep;
  r.min = min;
  r.max = max;
  r.kids.push_back(std::move(x));
  return r;
}

CpRanges cp_normalize(CpRanges r) {
  CpRanges out;
  for (auto& [lo, hi] : r) hi = std::min(hi, kMaxCodePoint);
  std::sort(r.begin(), r.end());
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.push_back({lo, hi});
  }
  return out;
}

CpRanges cp_negate(const CpRanges& in) {
  CpRanges r = cp_normalize(in), out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

namespace {

std::string utf8_encode(uint32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return s;
}

// Ranges whose ends have one encoded length, split until every byte position ranges
// independently (the classic UTF-8 range construction): then the range is a sequence of
// byte ranges.
void utf8_same_length(uint32_t lo, uint32_t hi, std::vector<Rx>& out) {
  const size_t n = utf8_encode(lo).size();
  for (size_t i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_same_length(lo, lo | m, out);
        utf8_same_length((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_same_length(lo, (hi & ~m) - 1, out);
        utf8_same_length(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = utf8_encode(lo), b = utf8_encode(hi);
  std::vector<Rx> seq;
  for (size_t k = 0; k < n; ++k)
    seq.push_back(
        rx_byte_range(static_cast<unsigned char>(a[k]), static_cast<unsigned char>(b[k])));
  out.push_back(rx_seq(std::move(seq)));
}

}  // namespace

Rx rx_utf8(const CpRanges& in) {
  CpRanges r;
  for (auto [lo, hi] : cp_normalize(in)) {  // surrogates are not characters
    if (hi < 0xD800 || lo > 0xDFFF) {
      r.push_back({lo, hi});
      continue;
    }
    if (lo < 0xD800) r.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF) r.push_back({0xE000, hi});
  }
  std::vector<Rx> alts;
  Rx ascii;
  ascii.kind = Rx::Kind::Set;
  for (auto [lo, hi] : r) {
    const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
    uint32_t a = lo;
    for (uint32_t b : bounds) {
      if (a > hi) break;
      if (a > b) continue;
      const uint32_t e = std::min(hi, b);
      if (b == 0x7F)
        for (uint32_t c = a; c <= e; ++c) ascii.bytes.set(c);
      else
        utf8_same_length(a, e, alts);
      a = e + 1;
    }
  }
  if (ascii.bytes.any()) alts.insert(alts.begin(), std::move(ascii));
  if (alts.empty()) {  // no character: a set that matches nothing
    Rx none;
    none.kind = Rx::Kind::Set;
    return none;
  }
  return rx_alt(std::move(alts));
}

}  // namespace loom::infer::constrain
