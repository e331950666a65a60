// Hugging Face tokenizer.json <-> Loom's byte-level BPE (BpeTokenizer).
//
// Loaded: a "BPE" model whose vocab keys and merges are in the byte-level alphabet, with the
// pre-tokenisation GPT-2, Llama 3 and Qwen2 use: ByteLevel with use_regex (GPT-2's regex), or a
// Sequence of a Split on the Llama 3 (= cl100k) or Qwen2 regex ("Isolated") and ByteLevel
// without regex. Merges may be "a b" strings or ["a", "b"] pairs; model.ignore_merges is
// honoured. added_tokens (special or not) become Loom special tokens with their own ids: they
// are cut out of text before BPE, as Hugging Face does. Ids are the file's own.
// The NFC normalizer (Qwen2) is applied where the build has utf8proc (normalize.h).
// Refused, naming the field: other models, other normalizers (and NFC without utf8proc), other
// pre-tokenizers or regexes,
// add_prefix_space, byte_fallback, dropout, subword prefixes/suffixes, added tokens with
// lstrip/rstrip/single_word, truncation. Not applied: post_processor (Loom never adds BOS/EOS
// by itself; chat templates write their own markers) and padding.
//
// Written: the same format (merges as "a b" strings, readable by every tokenizers version) and
// tokenizer_config.json with the special tokens and, for a chat template, its Jinja text.
#pragma once

#include <string>

#include "core/json.h"
#include "data/bpe.h"

namespace loom::data {

// `path` is a tokenizer.json file or a folder holding one.
BpeTokenizer load_hf_tokenizer(const std::string& path);
BpeTokenizer hf_tokenizer_from_json(const Json& j, const std::string& where);

Json hf_tokenizer_json(const BpeTokenizer& tok);

// tokenizer_config.json: added_tokens_decoder, bos/eos/pad tokens, chat_template (`chat` is a
// ChatTemplate name or empty for none), model_max_length.
Json hf_tokenizer_config_json(const BpeTokenizer& tok, const std::string& chat,
                              int64_t model_max_length);

// The ids a model's config.json / generation_config.json name: bos (-1 if none) and the ids that
// end generation (the chat template's end of turn first, then <|endoftext|>).
struct HfSpecialIds {
  int32_t bos = -1;
  std::vector<int32_t> eos;
};
HfSpecialIds hf_special_ids(const BpeTokenizer& tok, const std::string& chat);

// Writes DIR/tokenizer.json and DIR/tokenizer_config.json, each atomically.
void save_hf_tokenizer(const BpeTokenizer& tok, const std::string& dir, const std::string& chat,
                       int64_t model_max_length);

}  // namespace loom::data
