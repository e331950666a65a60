// UTF-8: encoding one code point, and the checks that keep written text valid (the decoders
// differ by what they must tolerate and live with their users: JSON, curation's repair, the
// tokenizer's pre-tokeniser).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// Appends code point `cp` (at most 0x10FFFF) to `out` as 1 to 4 bytes.
inline void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

inline constexpr std::string_view kUtf8Replacement = "\xEF\xBF\xBD";  // U+FFFD

// The character starting at s[i]: its length (1 to 4) when it is well-formed, else 0 with
// `bad` set to the length of its maximal ill-formed prefix (at least 1), which one U+FFFD
// replaces (Unicode's "maximal subpart" rule, as Python's and Rust's lossy decoders apply).
// `truncated` tells an ill-formed prefix that only lacks bytes past the end of s.
inline size_t utf8_char(std::string_view s, size_t i, size_t& bad, bool& truncated) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  truncated = false;
  bad = 1;
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (excludes overlongs, surrogates)
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      bad = k;
      truncated = true;
      return 0;
    }
    const unsigned char x = b(i + k);
    if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) {
      bad = k;
      return 0;
    }
  }
  return len;
}

// s with every ill-formed sequence replaced by U+FFFD.
inline std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t bad;
  bool truncated;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char(s, i, bad, truncated);
    if (n) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out += kUtf8Replacement;
      i += bad;
    }
  }
  return out;
}

// How many bytes at the end of s begin a character that is well-formed so far but incomplete
// (0 to 3): a stream holds them back until the rest arrives.
inline size_t utf8_incomplete_tail(std::string_view s) {
  const size_t from = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > from;) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && c < 0xC0) continue;  // a continuation byte: look further back
    if (c < 0x80) return 0;
    size_t bad;
    bool truncated;
    return utf8_char(s, i, bad, truncated) == 0 && truncated && i + bad == s.size() ? s.size() - i
                                                                                    : 0;
  }
  return 0;
}

}  // namespace loom
