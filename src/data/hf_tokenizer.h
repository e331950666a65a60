// Hugging Face tokenizer.json <-> Loom's BPE (BpeTokenizer).
//
// Loaded: "BPE" models of two kinds. Byte-level ones (a ByteLevel pre-tokenizer: GPT-2, Llama 3,
// Qwen2/3, DeepSeek V3) keep their vocabulary as bytes; the pre-tokenisations Loom's scanners
// know (ByteLevel with GPT-2's regex, or a Split on the Llama 3 = cl100k or Qwen2 regex before
// ByteLevel, after no normalizer or NFC) run on them directly, anything else through an
// HfPipeline (hf_pipeline.h). SentencePiece-style ones (no ByteLevel: Llama 2, Gemma, Mistral)
// keep their tokens as text, start BPE from characters and, with model.byte_fallback, write
// characters outside the vocabulary as <0xNN> tokens. Normalizers: Sequence (also empty),
// Prepend, Replace, Strip, NFC, NFKC. Pre-tokenizers: Sequence, Split (String or Regex patterns,
// regexes through PCRE2: hf_regex.h), Metaspace (its prepend schemes and split), ByteLevel.
// Decoders: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace. Post-processor:
// TemplateProcessing (a single text's tokens, BpeTokenizer::post_process), ByteLevel, Sequence.
// Merges may be "a b" strings or ["a", "b"] pairs; model.ignore_merges is honoured. added_tokens
// (special or not) are cut out of the text before anything else, as transformers.js does, with
// their lstrip/rstrip; ids are the file's own.
// "Unigram" models: [piece, score] vocabularies cut by Viterbi (BpeTokenizer::from_unigram),
// with unk_id and byte_fallback.
// Refused, naming the field's path (`normalizer.normalizers[2].type`): other models (WordPiece,
// WordLevel) and components, a Precompiled normalizer's charsmap, dropout, subword prefixes/suffixes, ByteLevel add_prefix_space,
// Split invert or Contiguous, added tokens with single_word, truncation. Not applied: padding,
// the post-processor's pair template.
//
// Written: a tokenizer read through an HfPipeline as its file was; a byte-level one in the same
// format (merges as "a b" strings, readable by every tokenizers version) and tokenizer_config.json
// with the special tokens and, for a chat template, its Jinja text.
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
