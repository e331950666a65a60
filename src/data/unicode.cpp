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

}  // namespace loom::data
