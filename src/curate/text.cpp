#include "curate/text.h"

#include <utf8proc.h>

#include <array>
#include <cstring>

namespace loom::curate {

int32_t utf8_next(std::string_view s, size_t& i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int n;
  int32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 1;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 2;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 3;
    cp = c & 0x07;
  } else {
    ++i;
    return -1;
  }
  for (int k = 1; k <= n; ++k) {
    if (i + k >= s.size() || (b(i + k) & 0xC0) != 0x80) {
      ++i;
      return -1;
    }
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are invalid.
  if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return -1;
  }
  i += n + 1;
  return cp;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    if (utf8_next(s, i) < 0) return false;
  }
  return true;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_alpha_cp(int32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  if (cp < 0) return false;
  auto cat = utf8proc_category(cp);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

bool is_space_cp(int32_t cp) {
  if (cp < 0x80)
    return cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == '\f' || cp == '\v';
  return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0x85;
}

bool is_ascii_punct(char c) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
         (c >= '{' && c <= '~');
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  split_lines(text, lines);
  return lines;
}

void split_lines(std::string_view text, std::vector<std::string_view>& lines) {
  lines.clear();
  size_t start = 0;
  for (;;) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
}

static bool ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  split_words(text, words);
  return words;
}

// Byte classes for split_words: bit 1 ASCII whitespace, bit 2 ASCII punctuation.
static constexpr auto kByteClass = [] {
  std::array<uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    bool punct = (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
                 (c >= '{' && c <= '~');
    t[static_cast<size_t>(c)] = static_cast<uint8_t>((space ? 1 : 0) | (punct ? 2 : 0));
  }
  return t;
}();

void split_words(std::string_view text, std::vector<std::string_view>& words) {
  words.clear();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0, n = text.size();
  while (i < n) {
    while (i < n && (kByteClass[p[i]] & 1)) ++i;
    size_t b = i;
    while (i < n && !(kByteClass[p[i]] & 1)) ++i;
    size_t e = i;
    while (b < e && (kByteClass[p[b]] & 2)) ++b;
    while (e > b && (kByteClass[p[e - 1]] & 2)) --e;
    if (e > b) words.push_back(text.substr(b, e - b));
  }
}

std::string_view trim_view(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && ascii_space(s[b])) ++b;
  while (e > b && ascii_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

// 64-bit multiply-mix hash over 8-byte words; two lanes with different seeds give 128 bits.
static inline uint64_t mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  return x;
}

uint64_t hash64(std::string_view s, uint64_t seed) {
  const uint64_t k = 0x9E3779B97F4A7C15ULL;
  uint64_t h = seed ^ (s.size() * k);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ mix(w + k)) * 0xff51afd7ed558ccdULL;
    h = (h << 31) | (h >> 33);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h ^= mix(tail ^ (static_cast<uint64_t>(s.size() - i) << 56));
  return mix(h);
}

Hash128 hash128(std::string_view s) {
  return {hash64(s, 0x243F6A8885A308D3ULL), hash64(s, 0x13198A2E03707344ULL)};
}

std::string normalize_for_dedup(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool space = false;
  for (char c : text) {
    if (ascii_space(c)) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
  }
  return out;
}

}  // namespace loom::curate
