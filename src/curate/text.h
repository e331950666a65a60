// Text helpers shared by the curation stages: UTF-8 decoding, word and line splitting the way
// the published filters count them, and a fast 128-bit hash for deduplication keys.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/swar.h"
#include "core/utf8.h"  // utf8_append, used by the stages

namespace loom::curate {

// Decodes one code point at s[i], advancing i. Invalid bytes decode as -1 and advance by one.
int32_t utf8_next(std::string_view s, size_t& i);
bool utf8_valid(std::string_view s);
size_t utf8_length(std::string_view s);  // code points (invalid bytes count one each)
bool is_ascii(std::string_view s);

// Letters in any script (utf8proc categories L*), or ASCII letters fast-pathed.
bool is_alpha_cp(int32_t cp);
bool is_space_cp(int32_t cp);
bool is_ascii_punct(char c);

// Lines split on '\n' (no trailing '\r' handling: the cleaning stage normalises newlines).
std::vector<std::string_view> split_lines(std::string_view text);
// Whitespace-separated tokens with leading/trailing ASCII punctuation removed; tokens that
// were only punctuation are dropped. This approximates the word counts of nltk's
// word_tokenize that datatrove's Gopher filters use, minus the punctuation tokens.
std::vector<std::string_view> split_words(std::string_view text);
// The same splits into a caller's vector (cleared first), so hot loops reuse its capacity.
void split_lines(std::string_view text, std::vector<std::string_view>& out);
void split_words(std::string_view text, std::vector<std::string_view>& out);
// Runs of bytes other than ' ', '\n' and '\t' (FineWeb's word count, for its list ratio).
size_t count_space_separated(std::string_view text);
std::string_view trim_view(std::string_view s);
std::string ascii_lower(std::string_view s);
bool ends_with(std::string_view s, std::string_view suffix);
bool starts_with(std::string_view s, std::string_view prefix);

struct Hash128 {
  uint64_t hi = 0, lo = 0;
  bool operator==(const Hash128& o) const { return hi == o.hi && lo == o.lo; }
  bool operator<(const Hash128& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
};
// Inline: the filters hash every word. Values are stable (dedup keys and tests depend on them).
inline uint64_t hash64(std::string_view s, uint64_t seed = 0);
Hash128 hash128(std::string_view s);
// A faster hash of long strings for in-memory tables that compare the strings themselves on
// equal hashes: its values may change between versions, so nothing stored may depend on them.
uint64_t table_hash(std::string_view s);

// Lowercase, whitespace runs collapsed to one space, trimmed: the key for exact dedup.
std::string normalize_for_dedup(std::string_view text);
// hash128(normalize_for_dedup(text)), with the text normalised eight bytes at a time into a
// buffer of the calling thread (no allocation once it has grown); the reference paths
// (reference_paths()) compute it as written above.
Hash128 dedup_hash(std::string_view text);

// Word-at-a-time helpers behind hash64, also used by the filters on short words.
namespace detail {

inline uint64_t hash_mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  return x;
}

// The last `rem` (< 8) bytes of s, as a memcpy of them into a zeroed word gives them, read
// with fixed-size loads inside s: a variable-length memcpy is a library call per word.
inline uint64_t load_tail(std::string_view s, size_t rem) {
  const char* p = s.data() + s.size() - rem;
  if (rem == 0) return 0;
  if (s.size() >= 8) return swar::load8(s.data() + s.size() - 8) >> (8 * (8 - rem));
  if (rem >= 4) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + rem - 4, 4);
    return lo | (static_cast<uint64_t>(hi) << (8 * (rem - 4)));
  }
  auto byte = [&](size_t k) { return static_cast<uint64_t>(static_cast<unsigned char>(p[k])); };
  return byte(0) | (byte(rem / 2) << (8 * (rem / 2))) | (byte(rem - 1) << (8 * (rem - 1)));
}

// The bytes of a piece s of 1 to 7 bytes of `text` into w, as load_tail(s, s.size()) gives
// them, with one read of 8 bytes of the text around s and no branch on the length of s: the 8
// that end where s ends, or else the 8 that start where s starts. False when neither lies
// inside the text, which happens only in texts under 15 bytes.
inline bool load_short_in(std::string_view text, std::string_view s, uint64_t& w) {
  const size_t n = s.size();
  if (s.data() + n >= text.data() + 8) {
    w = swar::load8(s.data() + n - 8) >> (8 * (8 - n));
    return true;
  }
  if (s.data() + 8 <= text.data() + text.size()) {
    w = swar::load8(s.data()) & ((uint64_t{1} << (8 * n)) - 1);
    return true;
  }
  return false;
}

// hash64 of a string of n < 8 bytes given as `packed`: its bytes (as load_tail gives them)
// with n in the top byte, which they leave free. A pure function of one word, so a loop of
// them vectorises.
inline uint64_t hash64_packed(uint64_t packed, uint64_t seed) {
  uint64_t h = seed ^ ((packed >> 56) * 0x9E3779B97F4A7C15ULL);
  return hash_mix(h ^ hash_mix(packed));
}

// UTF-8 continuation bytes (10xxxxxx) among the eight in w.
inline size_t continuation_bytes(uint64_t w) {
  return static_cast<size_t>(std::popcount(w & ~(w << 1) & swar::kHigh));
}

}  // namespace detail

// 64-bit multiply-mix hash over 8-byte words; two lanes with different seeds give 128 bits.
inline uint64_t hash64(std::string_view s, uint64_t seed) {
  const uint64_t k = 0x9E3779B97F4A7C15ULL;
  uint64_t h = seed ^ (s.size() * k);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    h = (h ^ detail::hash_mix(swar::load8(s.data() + i) + k)) * 0xff51afd7ed558ccdULL;
    h = (h << 31) | (h >> 33);
  }
  size_t rem = s.size() - i;
  h ^= detail::hash_mix(detail::load_tail(s, rem) ^ (static_cast<uint64_t>(rem) << 56));
  return detail::hash_mix(h);
}

}  // namespace loom::curate
