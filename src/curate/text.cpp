#include "curate/text.h"

#include <utf8proc.h>

#include <array>
#include <bit>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "curate/stage.h"  // reference_paths

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

// Eight bytes at a time: the filters call these on every word and on whole documents.

bool is_ascii(std::string_view s) {
  size_t i = 0;
  uint64_t any = 0;
  for (; i + 32 <= s.size(); i += 32)  // four loads per test of the high bits
    any |= swar::load8(s.data() + i) | swar::load8(s.data() + i + 8) |
           swar::load8(s.data() + i + 16) | swar::load8(s.data() + i + 24);
  for (; i + 8 <= s.size(); i += 8) any |= swar::load8(s.data() + i);
  any |= detail::load_tail(s, s.size() - i);
  return (any & swar::kHigh) == 0;
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
  size_t i = 0, continuation = 0;
  for (; i + 8 <= s.size(); i += 8)
    continuation += detail::continuation_bytes(swar::load8(s.data() + i));
  continuation += detail::continuation_bytes(detail::load_tail(s, s.size() - i));
  return s.size() - continuation;
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

// Bit k set when byte k of the 64 at p is '\n'.
static inline uint64_t newline_mask64(const unsigned char* p) {
#if defined(__SSE2__)
  uint64_t mask = 0;
  for (int k = 0; k < 4; ++k) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
    auto bits = _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')));
    mask |= static_cast<uint64_t>(static_cast<uint16_t>(bits)) << (16 * k);
  }
  return mask;
#else
  uint64_t mask = 0;
  for (int k = 0; k < 64; ++k) mask |= static_cast<uint64_t>(p[k] == '\n') << k;
  return mask;
#endif
}

// Newlines found 64 bytes at a time: lines are short, and a memchr call per line costs more
// than the search.
void split_lines(std::string_view text, std::vector<std::string_view>& lines) {
  lines.clear();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t start = 0;
  for (size_t block = 0; block < n; block += 64) {
    uint64_t mask;
    if (block + 64 <= n) {
      mask = newline_mask64(p + block);
    } else {
      unsigned char pad[64] = {};
      std::memcpy(pad, p + block, n - block);
      mask = newline_mask64(pad) & ((uint64_t{1} << (n - block)) - 1);
    }
    for (; mask; mask &= mask - 1) {
      size_t nl = block + static_cast<size_t>(std::countr_zero(mask));
      lines.push_back(text.substr(start, nl - start));
      start = nl + 1;
    }
  }
  lines.push_back(text.substr(start));
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

// Bit k of `space` (`punct`) set when byte k of the 64 at p is ASCII whitespace (space,
// \t \n \v \f \r) (ASCII punctuation): the classes of kByteClass, 64 bytes at a time.
struct ByteMasks {
  uint64_t space = 0, punct = 0;
};

static inline ByteMasks byte_masks64(const unsigned char* p) {
  ByteMasks m;
#if defined(__SSE2__)
  // x - lo <= hi - lo, unsigned, as min(x - lo, hi - lo) == x - lo.
  auto in_range = [](__m128i v, char lo, char hi) {
    __m128i d = _mm_sub_epi8(v, _mm_set1_epi8(lo));
    return _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(static_cast<char>(hi - lo))), d);
  };
  for (int k = 0; k < 4; ++k) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
    __m128i space = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(' ')), in_range(v, '\t', '\r'));
    // Punctuation: printable ASCII other than space, digits and letters.
    __m128i alnum = _mm_or_si128(in_range(v, '0', '9'),
                                 in_range(_mm_or_si128(v, _mm_set1_epi8(0x20)), 'a', 'z'));
    __m128i punct = _mm_andnot_si128(alnum, in_range(v, '!', '~'));
    m.space |= static_cast<uint64_t>(static_cast<uint16_t>(_mm_movemask_epi8(space))) << (16 * k);
    m.punct |= static_cast<uint64_t>(static_cast<uint16_t>(_mm_movemask_epi8(punct))) << (16 * k);
  }
#else
  for (int k = 0; k < 64; ++k) {
    m.space |= static_cast<uint64_t>(kByteClass[p[k]] & 1) << k;
    m.punct |= static_cast<uint64_t>((kByteClass[p[k]] >> 1) & 1) << k;
  }
#endif
  return m;
}

namespace {

// Finds whitespace and non-whitespace bytes 64 at a time: words are a few bytes long, so a
// byte loop spends most of its time on mispredicted branches.
class SpaceScanner {
 public:
  explicit SpaceScanner(std::string_view text)
      : p_(reinterpret_cast<const unsigned char*>(text.data())), n_(text.size()) {
    load(0);
  }
  // The first position >= i whose byte is (is_space) or is not (!is_space) whitespace, or the
  // text's size if there is none. Positions must not decrease between calls.
  size_t next(size_t i, bool is_space) {
    for (;;) {
      if (i >= n_) return n_;
      if (i >= block_ + 64) load(i & ~size_t{63});
      uint64_t m = (is_space ? masks_.space : ~masks_.space) >> (i - block_);
      if (m) return i + static_cast<size_t>(std::countr_zero(m));
      i = block_ + 64;
    }
  }
  // [b, e) without leading and trailing punctuation, when it lies in the block of the last
  // call (e may be the block's end); false otherwise.
  bool trim_punct(size_t& b, size_t& e) const {
    if (b < block_ || e > block_ + 64) return false;
    uint64_t range = (~uint64_t{0} << (b - block_)) & (~uint64_t{0} >> (64 - (e - block_)));
    uint64_t kept = range & ~masks_.punct;
    e = kept ? block_ + 64 - static_cast<size_t>(std::countl_zero(kept)) : b;
    b = kept ? block_ + static_cast<size_t>(std::countr_zero(kept)) : b;
    return true;
  }

 private:
  void load(size_t block) {
    block_ = block;
    if (block + 64 <= n_) {
      masks_ = byte_masks64(p_ + block);
      return;
    }
    // The last partial block, padded with spaces (bytes past the end end a word).
    unsigned char pad[64];
    std::memset(pad, ' ', sizeof(pad));
    if (block < n_) std::memcpy(pad, p_ + block, n_ - block);
    masks_ = byte_masks64(pad);
  }

  const unsigned char* p_;
  size_t n_;
  size_t block_ = 0;
  ByteMasks masks_;
};

}  // namespace

void split_words(std::string_view text, std::vector<std::string_view>& words) {
  words.clear();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(text.data());
  SpaceScanner scan(text);
  const size_t n = text.size();
  size_t i = scan.next(0, false);
  while (i < n) {
    size_t b = i;
    i = scan.next(i, true);
    size_t e = i;
    if (!scan.trim_punct(b, e)) {  // a word across blocks
      while (b < e && (kByteClass[p[b]] & 2)) ++b;
      while (e > b && (kByteClass[p[e - 1]] & 2)) --e;
    }
    if (e > b) words.push_back(text.substr(b, e - b));
    i = scan.next(i, false);
  }
}

// Bit k set when byte k of the 64 at p is ' ', '\n' or '\t'.
static inline uint64_t blank_mask64(const unsigned char* p) {
#if defined(__SSE2__)
  uint64_t mask = 0;
  for (int k = 0; k < 4; ++k) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
    __m128i blank = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(' ')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'))),
        _mm_cmpeq_epi8(v, _mm_set1_epi8('\t')));
    mask |= static_cast<uint64_t>(static_cast<uint16_t>(_mm_movemask_epi8(blank))) << (16 * k);
  }
  return mask;
#else
  uint64_t mask = 0;
  for (int k = 0; k < 64; ++k)
    mask |= static_cast<uint64_t>(p[k] == ' ' || p[k] == '\n' || p[k] == '\t') << k;
  return mask;
#endif
}

// A run starts at each non-blank byte after a blank one (or at the start): count those
// 64 bytes at a time instead of branching on every byte.
size_t count_space_separated(std::string_view text) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t runs = 0;
  uint64_t before = 1;  // whether the byte before the block is blank (the start counts as one)
  for (size_t block = 0; block < n; block += 64) {
    uint64_t blank;
    if (block + 64 <= n) {
      blank = blank_mask64(p + block);
    } else {
      unsigned char pad[64];
      std::memset(pad, ' ', sizeof(pad));  // blank past the end: starts no run
      std::memcpy(pad, p + block, n - block);
      blank = blank_mask64(pad);
    }
    runs += static_cast<size_t>(std::popcount(~blank & ((blank << 1) | before)));
    before = blank >> 63;
  }
  return runs;
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

// Four independent lanes over 32-byte stripes (the round of xxHash64), so the multiplies
// overlap instead of forming one chain through the whole string as in hash64.
uint64_t table_hash(std::string_view s) {
  constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL;
  auto round = [](uint64_t acc, uint64_t w) { return std::rotl(acc + w * kP2, 31) * kP1; };
  const char* p = s.data();
  const size_t n = s.size();
  size_t i = 0;
  uint64_t h = kP1 ^ n;
  if (n >= 32) {
    uint64_t a = kP1 + kP2, b = kP2, c = 0, d = 0 - kP1;
    for (; i + 32 <= n; i += 32) {
      a = round(a, swar::load8(p + i));
      b = round(b, swar::load8(p + i + 8));
      c = round(c, swar::load8(p + i + 16));
      d = round(d, swar::load8(p + i + 24));
    }
    h ^= std::rotl(a, 1) + std::rotl(b, 7) + std::rotl(c, 12) + std::rotl(d, 18);
  }
  for (; i + 8 <= n; i += 8) h = round(h, swar::load8(p + i));
  h = round(h, detail::load_tail(s, n - i));
  return detail::hash_mix(h);
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

// normalize_for_dedup into out[0..), returning the length, eight bytes at a time: the bytes
// before the first ASCII space of each eight are lowercased and stored as one word (of which
// only those bytes are kept), then the run of spaces is skipped and stands for one ' ' if a
// byte follows. out has room for text.size() + 8 bytes: a word store may pass what is kept,
// never the input's length plus eight (every skipped space leaves a byte of room).
static size_t normalize_for_dedup_into(std::string_view text, char* out) {
  using namespace swar;
  const char* p = text.data();
  const size_t n = text.size();
  size_t i = 0, o = 0;
  bool space = false;
  while (i + 8 <= n) {
    const uint64_t w = load8(p + i);
    // ' ' and \t \n \v \f \r (0x09-0x0D): ascii_space.
    const uint64_t spaces = equal(w, ' ') | ascii_in_range(w, 0x09, 0x0D);
    const size_t k = spaces == 0 ? 8 : first(spaces);
    if (k > 0) {
      if (space) out[o++] = ' ';
      space = false;
      const uint64_t lower = w | (ascii_in_range(w, 'A', 'Z') >> 2);
      std::memcpy(out + o, &lower, 8);
      o += k;
      i += k;
    }
    if (k == 8) continue;
    while (i < n && ascii_space(p[i])) ++i;
    space = o > 0;
  }
  for (; i < n; ++i) {
    const char c = p[i];
    if (ascii_space(c)) {
      space = o > 0;
      continue;
    }
    if (space) out[o++] = ' ';
    space = false;
    out[o++] = (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
  }
  return o;
}

Hash128 dedup_hash(std::string_view text) {
  if (reference_paths()) return hash128(normalize_for_dedup(text));
  thread_local std::string buf;
  if (buf.size() < text.size() + 8) buf.resize(text.size() + 8);
  return hash128(std::string_view(buf.data(), normalize_for_dedup_into(text, buf.data())));
}

}  // namespace loom::curate
