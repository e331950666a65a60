#include "data/unicode.h"

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::data {
namespace detail {

namespace {
struct Range {
  uint32_t first, last;
  uint8_t cls;
};
constexpr uint8_t L = uint8_t(CharClass::Letter), N = uint8_t(CharClass::Number),
                  S = uint8_t(CharClass::Space);
const Range kRanges[] = {
#include "data/unicode_classes.inc"
};
}  // namespace

ClassTable::ClassTable() {
  // Expand the ranges into 256-entry blocks and share identical blocks (most are all-Other
  // or all-Letter), which keeps the table around 100 KB.
  std::vector<uint8_t> flat(0x110000, 0);
  for (const Range& r : kRanges) std::memset(&flat[r.first], r.cls, r.last - r.first + 1);
  std::unordered_map<std::string, uint16_t> unique;
  std::string blocks;
  for (uint32_t b = 0; b < (0x110000 >> 8); ++b) {
    std::string blk(reinterpret_cast<const char*>(&flat[b << 8]), 256);
    auto [it, inserted] = unique.emplace(blk, uint16_t(unique.size()));
    if (inserted) blocks += blk;
    block[b] = it->second;
  }
  classes = new uint8_t[blocks.size()];  // lives for the whole program
  std::memcpy(classes, blocks.data(), blocks.size());
}

const ClassTable g_class_table;

}  // namespace detail

bool utf8_valid(std::string_view s, size_t* bad_offset) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp;
    int len = utf8_decode(p + i, n - i, &cp);
    if (cp == kInvalidCodePoint) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += size_t(len);
  }
  return true;
}

std::string utf8_replace_invalid(std::string_view s) {
  if (utf8_valid(s)) return std::string(s);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  std::string out;
  out.reserve(n + 8);
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    const int len = p[i] < 0x80 ? 1 : utf8_decode(p + i, n - i, &cp);
    if (p[i] < 0x80 || cp != kInvalidCodePoint) {
      out.append(s.data() + i, size_t(len));
      i += size_t(len);
      continue;
    }
    // The maximal subpart: the lead byte and the continuation bytes that could still have
    // completed a valid sequence.
    const uint8_t b0 = p[i];
    size_t need = b0 >= 0xC2 && b0 < 0xE0   ? 1
                  : b0 >= 0xE0 && b0 < 0xF0 ? 2
                  : b0 >= 0xF0 && b0 < 0xF5 ? 3
                                            : 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
    size_t j = i + 1;
    for (size_t k = 0; k < need && j < n; ++k, ++j) {
      if (p[j] < lo || p[j] > hi) break;
      lo = 0x80;
      hi = 0xBF;
    }
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

bool js_space(uint32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string js_trim(std::string_view s, bool left, bool right) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t b = 0, e = s.size();
  uint32_t cp;
  while (left && b < e) {
    const int len = utf8_decode(p + b, e - b, &cp);
    if (!js_space(cp)) break;
    b += size_t(len);
  }
  while (right && e > b) {
    size_t k = e - 1;
    while (k > b && (p[k] & 0xC0) == 0x80) --k;
    utf8_decode(p + k, e - k, &cp);
    if (!js_space(cp)) break;
    e = k;
  }
  return std::string(s.substr(b, e - b));
}

}  // namespace loom::data
