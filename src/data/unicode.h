// Code point classes for the BPE pre-tokenisers and a strict UTF-8 decoder. The classes are
// the three the GPT-2 / cl100k regexes test: \p{L}, \p{N} and \s (Unicode White_Space).
// The table is generated from the Unicode Character Database (gen_unicode_classes.py), so the
// data layer needs no Unicode library at build or run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::data {

enum class CharClass : uint8_t { Other = 0, Letter = 1, Number = 2, Space = 3 };

namespace detail {
// Two-stage lookup: block index per 256 code points, then one class byte per code point.
struct ClassTable {
  ClassTable();
  uint16_t block[0x110000 >> 8];
  uint8_t* classes = nullptr;  // n_blocks * 256
};
extern const ClassTable g_class_table;
}  // namespace detail

inline CharClass char_class(uint32_t cp) {
  if (cp >= 0x110000) return CharClass::Other;
  const auto& t = detail::g_class_table;
  return static_cast<CharClass>(t.classes[(size_t(t.block[cp >> 8]) << 8) | (cp & 0xFF)]);
}

// Marks a byte that does not start a valid UTF-8 sequence; it is its own "code point".
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFF;

// Decodes one code point at p (n > 0 bytes available). Returns its length in bytes (1..4).
// Overlong forms, surrogates, values above U+10FFFF and truncated sequences are invalid:
// the first byte alone is returned with *cp = kInvalidCodePoint.
inline int utf8_decode(const uint8_t* p, size_t n, uint32_t* cp) {
  uint8_t b0 = p[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  *cp = kInvalidCodePoint;
  if (b0 < 0xC2) return 1;  // continuation byte or overlong 2-byte lead
  if (b0 < 0xE0) {
    if (n < 2 || (p[1] & 0xC0) != 0x80) return 1;
    *cp = (uint32_t(b0 & 0x1F) << 6) | (p[1] & 0x3F);
    return 2;
  }
  if (b0 < 0xF0) {
    if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 1;
    uint32_t c = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    if (c < 0x800 || (c >= 0xD800 && c < 0xE000)) return 1;
    *cp = c;
    return 3;
  }
  if (b0 < 0xF5) {
    if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 1;
    uint32_t c = (uint32_t(b0 & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) |
                 (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    if (c < 0x10000 || c > 0x10FFFF) return 1;
    *cp = c;
    return 4;
  }
  return 1;
}

// Class of the code point at p; *len receives its byte length. Invalid bytes are Other.
inline CharClass class_at(const uint8_t* p, size_t n, int* len) {
  if (p[0] < 0x80) {
    *len = 1;
    return static_cast<CharClass>(detail::g_class_table.classes[p[0]]);
  }
  uint32_t cp;
  *len = utf8_decode(p, n, &cp);
  return cp == kInvalidCodePoint ? CharClass::Other : char_class(cp);
}

// True if s is valid UTF-8; otherwise *bad_offset (if given) is the first invalid byte.
bool utf8_valid(std::string_view s, size_t* bad_offset = nullptr);

// s with every ill-formed sequence replaced by U+FFFD, one per maximal subpart (the WHATWG
// decoder's rule, which TextDecoder and Node's file reading follow).
std::string utf8_replace_invalid(std::string_view s);

// JavaScript's white space (String.prototype.trim, regex \s).
bool js_space(uint32_t cp);
// Valid UTF-8 s without its leading (left) and trailing (right) JavaScript white space.
std::string js_trim(std::string_view s, bool left, bool right);

}  // namespace loom::data
