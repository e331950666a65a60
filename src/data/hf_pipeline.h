// The text steps of a Hugging Face tokenizer.json that run around its BPE model: normalizers,
// pre-tokenizers, decoders and the post-processor's special tokens. hf_tokenizer.cpp builds one
// from the file; BpeTokenizer runs it (bpe.h). Steps do what transformers.js (the reference of
// Loom's tests) does, except Split's behaviours and Metaspace's split, which it simplifies: those
// follow Hugging Face's tokenizers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/hf_regex.h"

namespace loom::data {

struct HfNormalizer {
  enum class Kind { Prepend, Replace, Strip, Nfc, Nfkc };
  Kind kind = Kind::Prepend;
  std::string text;                      // Prepend: the prefix; Replace: the literal pattern
  std::shared_ptr<const HfRegex> regex;  // Replace with a Regex pattern
  std::string content;                   // Replace: the replacement
  bool left = false, right = false;      // Strip
};

struct HfPreTokenizer {
  enum class Kind { Split, Metaspace, ByteLevel };
  enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };
  // Metaspace's prepend_scheme: always, only the text before the first added token, never.
  enum class Prepend { Always, First, Never };
  Kind kind = Kind::Split;
  std::shared_ptr<const HfRegex> regex;  // Split
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  std::string replacement;  // Metaspace
  Prepend prepend = Prepend::Always;
  bool split = true;      // Metaspace: a piece starts at every replacement character
  bool use_regex = true;  // ByteLevel: GPT-2's regex
};

struct HfDecoder {
  enum class Kind { Replace, ByteFallback, Fuse, Strip, Metaspace };
  Kind kind = Kind::Fuse;
  std::string pattern;         // Replace: the literal pattern; Metaspace: the replacement
  std::string content;         // Replace: the replacement; Strip: the character stripped
  size_t start = 0, stop = 0;  // Strip
  bool strip_first = true;     // Metaspace: drop the first token's leading space
};

class HfPipeline {
 public:
  std::vector<HfNormalizer> normalizers;
  std::vector<HfPreTokenizer> pre_tokenizers;
  std::vector<HfDecoder> decoders;
  // SentencePiece-style model: tokens are text, BPE starts from characters, and a character
  // outside the vocabulary becomes its UTF-8 bytes' <0xNN> tokens (byte_fallback) or unk_id.
  // Otherwise tokens are bytes (ByteLevel) and decoding concatenates them.
  bool char_model = false;
  bool byte_fallback = false;
  // char_model: the characters some token holds right before a ▁ (U+2581). Before any other
  // character a ▁ starts a piece of its own, as no merge can reach across it; splitting there
  // keeps BPE short and cached without changing its result.
  std::vector<std::string> joins_space_mark;
  // False when Loom's byte-level scanners do the same text steps (the pipeline then only
  // adds the post-processor's tokens).
  bool runs_encode = true;
  int32_t unk_id = -1;
  // The post-processor's tokens around a text (add_special_tokens).
  std::vector<int32_t> prefix, suffix;
  // Added tokens that take the white space before (lstrip) or after (rstrip) them, and those
  // that match only as a whole word (single_word: no letter, digit or '_' beside them), by id.
  std::vector<int32_t> lstrip_ids, rstrip_ids, single_word_ids;
  // Added tokens marked special (a Unigram model's lattice leaves them out).
  std::vector<int32_t> special_ids;
  // Added tokens with `normalized` true: matched in the normalized text of the sections the
  // others leave, by their content as the normalizers write it (Hugging Face's rule).
  std::vector<std::pair<std::string, int32_t>> normalized_added;
  std::string source;  // the tokenizer.json text, written back unchanged on export

  std::string normalize(std::string text) const;
  // Appends the pieces the model encodes one by one. `first` marks the text before any added
  // token (Metaspace's "first" scheme).
  void pre_tokenize(const std::string& text, bool first, std::vector<std::string>& pieces) const;
  // The decoder chain over token strings (char_model only).
  std::string decode(std::vector<std::string> tokens) const;
  // One token's text for streaming: its replacements applied and <0xNN> as the raw byte.
  std::string token_text(std::string_view token) const;
};

}  // namespace loom::data
