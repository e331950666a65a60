// Text helpers shared by the curation stages: UTF-8 decoding, word and line splitting the way
// the published filters count them, and a fast 128-bit hash for deduplication keys.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
std::string_view trim_view(std::string_view s);
std::string ascii_lower(std::string_view s);
bool ends_with(std::string_view s, std::string_view suffix);
bool starts_with(std::string_view s, std::string_view prefix);

struct Hash128 {
  uint64_t hi = 0, lo = 0;
  bool operator==(const Hash128& o) const { return hi == o.hi && lo == o.lo; }
  bool operator<(const Hash128& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
};
uint64_t hash64(std::string_view s, uint64_t seed = 0);
Hash128 hash128(std::string_view s);

// Lowercase, whitespace runs collapsed to one space, trimmed: the key for exact dedup.
std::string normalize_for_dedup(std::string_view text);

}  // namespace loom::curate
