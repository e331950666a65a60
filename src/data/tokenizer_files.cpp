#include "data/tokenizer_files.h"

#include <array>
#include <cstdint>

#include "core/error.h"

namespace loom::data {

namespace {

struct ByteLevelTables {
  std::array<uint32_t, 256> cp{};
  std::array<int16_t, 0x144> byte{};  // code point -> byte, -1 outside the alphabet
  ByteLevelTables() {
    byte.fill(-1);
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      cp[size_t(b)] = direct ? uint32_t(b) : 256 + extra++;
      byte[cp[size_t(b)]] = int16_t(b);
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

uint32_t byte_level_codepoint(uint8_t b) {
  return tables().cp[b];
}

bool byte_level_decode(std::string_view s, std::string* out) {
  const ByteLevelTables& t = tables();
  out->clear();
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = p[i];
    size_t len = 1;
    if (cp >= 0x80) {  // the alphabet stops at U+0143: two-byte UTF-8 at most
      if ((cp & 0xE0) != 0xC0 || i + 1 >= s.size() || (p[i + 1] & 0xC0) != 0x80) return false;
      cp = ((cp & 0x1F) << 6) | (p[i + 1] & 0x3F);
      len = 2;
    }
    if (cp >= t.byte.size() || t.byte[cp] < 0) return false;
    out->push_back(char(t.byte[cp]));
    i += len;
  }
  return true;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    uint32_t cp = byte_level_codepoint(uint8_t(c));
    if (cp < 0x80) {
      out.push_back(char(cp));
    } else {
      out.push_back(char(0xC0 | (cp >> 6)));
      out.push_back(char(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

void check_id_bound(size_t max_id, size_t n_entries, const std::string& where) {
  LOOM_CHECK(max_id < n_entries + kMaxIdHoles, where, ": id ", max_id, " is too large for ",
             n_entries, " tokens (at most ", kMaxIdHoles, " unused ids are allowed)");
}

}  // namespace loom::data
