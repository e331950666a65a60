// SentencePiece's tokenizer.model (the protobuf old Llama 2, Mistral and Gemma repositories ship
// instead of a tokenizer.json) as a Loom tokenizer.
//
// The model is read and run by Debian's libsentencepiece (libsentencepiece-dev, optional at
// build time like PCRE2 and utf8proc: a build without it refuses these files naming the
// package). Loom does not convert the model into its own BPE or Unigram: the library's public
// interface exposes the pieces, scores and kinds but not the normalizer (its compiled character
// map, dummy prefix and white-space rules) or the model type, which only a hand-written protobuf
// reader could take out of the file. Wrapped, BPE and Unigram models, any normalization, byte
// fallback and user-defined symbols encode and decode exactly as the library does.
//
// Loom's side: control pieces (<s>, </s>) and <unk> are special tokens, cut out of the text
// first when specials are allowed; every other piece is an ordinary token holding its text (▁
// for a space). post_process puts <s> in front when the model has one, as Hugging Face's
// LlamaTokenizer (add_bos_token). Decoding is the library's (control pieces decode to nothing,
// <unk> to " ⁇ "); decode_append streams a piece's text with ▁ as a space and <0xNN> as its
// byte. Like every BpeTokenizer it may encode from many threads at once: the library's Encode
// and Decode are const and keep no shared state.
#pragma once

#include <string>

#include "data/bpe.h"

namespace loom::data {

// True when this build has libsentencepiece.
bool sentencepiece_available();

// `path` is a tokenizer.model file or a folder holding one. Throws naming the file when it is
// not a SentencePiece model (truncated, corrupt) or the build has no libsentencepiece.
BpeTokenizer load_spm_tokenizer(const std::string& path);
BpeTokenizer spm_tokenizer_from_bytes(const std::string& bytes, const std::string& where);

// The model file's bytes (a tokenizer from load_spm_tokenizer), empty for any other tokenizer:
// what save_hf_tokenizer writes as tokenizer.model.
std::string spm_model_bytes(const BpeTokenizer& tok);

}  // namespace loom::data
