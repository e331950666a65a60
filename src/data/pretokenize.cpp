#include "data/pretokenize.h"

#include "core/error.h"
#include "data/unicode.h"

namespace loom::data {

PreTokenizer parse_pretokenizer(const std::string& name) {
  if (name == "gpt2") return PreTokenizer::Gpt2;
  if (name == "cl100k" || name == "cl100k_base") return PreTokenizer::Cl100k;
  if (name == "qwen2") return PreTokenizer::Qwen2;
  fail("unknown pre-tokenizer '", name, "' (expected gpt2, cl100k or qwen2)");
}

const char* pretokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::Gpt2:
      return "gpt2";
    case PreTokenizer::Cl100k:
      return "cl100k";
    case PreTokenizer::Qwen2:
      return "qwen2";
  }
  return "?";
}

namespace {

// End of the run of code points of class c starting at byte i.
inline size_t run_of(const uint8_t* s, size_t n, size_t i, CharClass c) {
  while (i < n) {
    int len;
    if (class_at(s + i, n - i, &len) != c) break;
    i += size_t(len);
  }
  return i;
}

// Whitespace run starting at i (s[i] is whitespace). *last_start receives the start of its
// last code point; *last_newline the position after its last \r or \n (0 if none).
inline size_t space_run(const uint8_t* s, size_t n, size_t i, size_t* last_start,
                        size_t* last_newline) {
  *last_newline = 0;
  while (i < n) {
    int len;
    if (class_at(s + i, n - i, &len) != CharClass::Space) break;
    if (s[i] == '\r' || s[i] == '\n') *last_newline = i + 1;
    *last_start = i;
    i += size_t(len);
  }
  return i;
}

// The two regexes end alike: \s+(?!\S)|\s+ . A run reaching the end of text is taken whole;
// a run followed by a non-space gives up its last code point to it (that one then prefixes
// the next word) unless it is only one code point long.
inline size_t trailing_space_rule(size_t start, size_t end, size_t last_start, size_t n) {
  if (end == n || last_start == start) return end;
  return last_start;
}

inline bool is_lower_ascii(uint8_t c, char lower) {
  return (c | 0x20) == lower;
}

}  // namespace

size_t next_piece_gpt2(const uint8_t* s, size_t n, size_t i) {
  uint8_t c = s[i];
  if (c == '\'' && i + 1 < n) {  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
    uint8_t a = s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      uint8_t b = s[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  int len0;
  CharClass c0 = class_at(s + i, n - i, &len0);
  if (c == ' ' && i + 1 < n) {  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
    int len1;
    CharClass c1 = class_at(s + i + 1, n - i - 1, &len1);
    if (c1 != CharClass::Space) return run_of(s, n, i + 1 + size_t(len1), c1);
  }
  if (c0 != CharClass::Space) return run_of(s, n, i + size_t(len0), c0);
  size_t last_start = i, last_newline;
  size_t end = space_run(s, n, i, &last_start, &last_newline);
  return trailing_space_rule(i, end, last_start, n);
}

namespace {

// cl100k's regex and Qwen2's, which differ only in how many digits make one piece.
size_t next_piece_cl100k_like(const uint8_t* s, size_t n, size_t i, int max_digits) {
  uint8_t c = s[i];
  if (c == '\'' && i + 1 < n) {  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    uint8_t a = s[i + 1];
    if (is_lower_ascii(a, 's') || is_lower_ascii(a, 't') || is_lower_ascii(a, 'm') ||
        is_lower_ascii(a, 'd'))
      return i + 2;
    if (i + 2 < n) {
      uint8_t b = s[i + 2];
      if ((is_lower_ascii(a, 'r') && is_lower_ascii(b, 'e')) ||
          (is_lower_ascii(a, 'v') && is_lower_ascii(b, 'e')) ||
          (is_lower_ascii(a, 'l') && is_lower_ascii(b, 'l')))
        return i + 3;
    }
  }
  int len0;
  CharClass c0 = class_at(s + i, n - i, &len0);
  size_t after0 = i + size_t(len0);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c0 == CharClass::Letter) return run_of(s, n, after0, CharClass::Letter);
  if (c0 != CharClass::Number && c != '\r' && c != '\n' && after0 < n) {
    int len1;
    if (class_at(s + after0, n - after0, &len1) == CharClass::Letter)
      return run_of(s, n, after0 + size_t(len1), CharClass::Letter);
  }
  if (c0 == CharClass::Number) {  // \p{N}{1,3} (cl100k), \p{N} (qwen2)
    size_t j = after0;
    for (int k = 1; k < max_digits && j < n; ++k) {
      int len;
      if (class_at(s + j, n - j, &len) != CharClass::Number) break;
      j += size_t(len);
    }
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t other_start = n;  // n: no match
  if (c0 == CharClass::Other) {
    other_start = i;
  } else if (c == ' ' && after0 < n) {
    int len1;
    if (class_at(s + after0, n - after0, &len1) == CharClass::Other) other_start = after0;
  }
  if (other_start < n) {
    size_t j = run_of(s, n, other_start, CharClass::Other);
    while (j < n && (s[j] == '\r' || s[j] == '\n')) ++j;
    return j;
  }
  // \s*[\r\n]+ : the whitespace run up to and including its last newline.
  size_t last_start = i, last_newline;
  size_t end = space_run(s, n, i, &last_start, &last_newline);
  if (last_newline) return last_newline;
  return trailing_space_rule(i, end, last_start, n);
}

}  // namespace

size_t next_piece_cl100k(const uint8_t* s, size_t n, size_t i) {
  return next_piece_cl100k_like(s, n, i, 3);
}

size_t next_piece_qwen2(const uint8_t* s, size_t n, size_t i) {
  return next_piece_cl100k_like(s, n, i, 1);
}

}  // namespace loom::data
