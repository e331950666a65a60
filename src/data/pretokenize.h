// Pre-tokenisers: split text into the pieces BPE merges within, exactly as the GPT-2 and
// cl100k_base regexes do, but as hand-written scanners over code points (no regex engine):
//
//   gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   cl100k: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2:  cl100k's with \p{N} instead of \p{N}{1,3} (digits one by one; Qwen2's tokenizer.json)
//
// \s is Unicode White_Space (as in tiktoken's Rust regex). Bytes that are not valid UTF-8
// count as one "other" code point each, so any byte string splits and round-trips.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::data {

enum class PreTokenizer { Gpt2, Cl100k, Qwen2 };

PreTokenizer parse_pretokenizer(const std::string& name);  // "gpt2" | "cl100k" | "qwen2"
const char* pretokenizer_name(PreTokenizer p);

// End (exclusive) of the piece that starts at byte i < n.
size_t next_piece_gpt2(const uint8_t* s, size_t n, size_t i);
size_t next_piece_cl100k(const uint8_t* s, size_t n, size_t i);
size_t next_piece_qwen2(const uint8_t* s, size_t n, size_t i);

inline size_t next_piece(PreTokenizer p, const uint8_t* s, size_t n, size_t i) {
  switch (p) {
    case PreTokenizer::Gpt2:
      return next_piece_gpt2(s, n, i);
    case PreTokenizer::Cl100k:
      return next_piece_cl100k(s, n, i);
    case PreTokenizer::Qwen2:
      return next_piece_qwen2(s, n, i);
  }
  return n;
}

// Calls f(std::string_view piece) for every piece of text, in order.
template <typename F>
void for_each_piece(PreTokenizer p, std::string_view text, F&& f) {
  const uint8_t* s = reinterpret_cast<const uint8_t*>(text.data());
  size_t n = text.size();
  for (size_t i = 0; i < n;) {
    size_t j = next_piece(p, s, n, i);
    f(text.substr(i, j - i));
    i = j;
  }
}

}  // namespace loom::data
