// Byte-level BPE tokenizer: GPT-2 (encoder.json + vocab.bpe), tiktoken rank files and
// Loom-trained vocabularies, all run by one merge loop over token ids.
//
// Encoding: split out special tokens, pre-tokenise (pretokenize.h), then merge each piece's
// bytes: repeatedly merge the adjacent pair with the lowest rank (leftmost on ties). For
// tiktoken files a pair's rank is the rank of the concatenated bytes (tiktoken's rule); for
// the GPT-2 format it is the line of vocab.bpe that merges the pair (GPT-2's rule). Both are
// stored as one (left id, right id) -> (rank, merged id) table.
//
// A tokenizer.json whose steps the byte-level scanners do not cover (SentencePiece-style
// vocabularies, other normalizers and pre-tokenizers) carries an HfPipeline (hf_pipeline.h):
// encoding then runs its normalizers and pre-tokenizers around the same merge loop, and
// decoding its decoder chain.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/hash_tables.h"
#include "data/pretokenize.h"

namespace loom::data {

class HfPipeline;

// Encoding and decoding done by another library for a vocabulary Loom holds the texts of
// (SentencePiece's tokenizer.model: spm_tokenizer.h).
class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;
  // Appends the ids of a text without special tokens.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
};

using SpecialTokens = std::vector<std::pair<std::string, int32_t>>;

class BpeTokenizer {
 public:
  // tokens[id] = the bytes of token `id` (ids with empty bytes are unused); every single
  // byte must be a token. Merge pairs come from splitting each token into two tokens
  // (tiktoken's rule: rank = id).
  static BpeTokenizer from_ranks(std::vector<std::string> tokens, PreTokenizer pre,
                                 SpecialTokens specials);
  // GPT-2's rule: merges[k] = (left bytes, right bytes) with rank k. ignore_merges (Hugging
  // Face's BPE option, set by Llama 3's tokenizer.json) first takes a piece that is itself a
  // token as that token, as tiktoken does.
  static BpeTokenizer from_merges(std::vector<std::string> tokens,
                                  const std::vector<std::pair<std::string, std::string>>& merges,
                                  PreTokenizer pre, SpecialTokens specials,
                                  bool ignore_merges = false,
                                  std::shared_ptr<const HfPipeline> pipeline = nullptr);

  // A Unigram model (a tokenizer.json "Unigram"): tokens[id] with log-probability scores[id];
  // each piece is cut by Viterbi over the tokens it starts with, as SentencePiece and
  // transformers.js do. The pipeline's unk_id scores the lowest score minus 10 for a character
  // no single token covers; consecutive unknown characters become one unk_id, or their bytes'
  // <0xNN> tokens with the pipeline's byte_fallback.
  static BpeTokenizer from_unigram(std::vector<std::string> tokens, std::vector<double> scores,
                                   SpecialTokens specials,
                                   std::shared_ptr<const HfPipeline> pipeline);

  // A vocabulary another library encodes and decodes: tokens[id] its texts (empty for the
  // specials' ids), `pipeline` a SentencePiece-style one giving the streaming texts and the
  // post-processor's tokens. Special tokens in the text are cut out first, as for tokenizer.json.
  static BpeTokenizer from_backend(std::vector<std::string> tokens, SpecialTokens specials,
                                   std::shared_ptr<const HfPipeline> pipeline,
                                   std::shared_ptr<const TokenizerBackend> backend);
  const TokenizerBackend* backend() const { return backend_.get(); }

  // Unicode NFC applied to the text between special tokens before pre-tokenisation (a
  // tokenizer.json "normalizer": NFC, as Qwen2's). Needs nfc_available() (normalize.h).
  void set_nfc(bool on);
  bool nfc() const { return nfc_; }

  BpeTokenizer(BpeTokenizer&&) = default;
  BpeTokenizer& operator=(BpeTokenizer&&) = default;

  // Appends the ids of text to out. With allow_special, special-token strings in the text
  // become their ids; otherwise they are encoded as ordinary text. Safe to call from many
  // threads at once (each thread keeps its own piece cache).
  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special = true) const;
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const {
    std::vector<int32_t> out;
    encode(text, out, allow_special);
    return out;
  }
  // BPE of one pre-tokenised piece (no cache); exposed for tests and training.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // Adds the post-processor's special tokens around the ids of one text (Hugging Face's
  // add_special_tokens: Llama 2's <s> in front); nothing for tokenizers without one.
  void post_process(std::vector<int32_t>& ids) const;

  // Exact inverse of encode for byte-level vocabularies. A SentencePiece-style one decodes
  // through its decoder chain (byte tokens as UTF-8 with U+FFFD for ill-formed runs, its
  // leading-space strip). Throws loom::Error on an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const;
  // One token's bytes, for streaming; a SentencePiece-style token's text with its
  // replacement character as a space and a <0xNN> token as that byte.
  void decode_append(int32_t id, std::string& out) const;

  int32_t vocab_size() const { return vocab_size_; }  // largest id + 1
  PreTokenizer pretokenizer() const { return pre_; }
  const SpecialTokens& specials() const { return specials_; }
  int32_t special_id(std::string_view text) const;  // -1 if not a special token
  // The end-of-document token: <|endoftext|> if present, else -1.
  int32_t eot_id() const { return special_id("<|endoftext|>"); }
  // The tokenizer.json steps this vocabulary runs, or null (hf_pipeline.h).
  const HfPipeline* hf_pipeline() const { return hf_.get(); }
  // Tokens are bytes (every vocabulary but a SentencePiece-style tokenizer.json's, whose
  // tokens are text in the model's own alphabet).
  bool byte_level() const;
  // Bytes of an ordinary token (empty for specials and unused ids).
  const std::string& token_bytes(int32_t id) const { return tokens_[size_t(id)]; }
  size_t n_ordinary() const { return tokens_.size(); }
  bool uses_merge_ranks() const { return merge_rule_; }
  bool unigram() const { return !scores_.empty(); }
  // A piece that is a token encodes as that token (tiktoken files, ignore_merges).
  bool takes_whole_pieces() const { return whole_piece_; }
  // Every merge as (left id, right id), lowest rank first: the merge list a Hugging Face
  // tokenizer.json needs. For rank files, a token's splits in id order (tiktoken's rule).
  const std::vector<std::pair<int32_t, int32_t>>& merge_list() const { return merge_list_; }

 private:
  BpeTokenizer() = default;
  void init_common();
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, std::vector<int32_t>& out) const;
  void encode_pipeline(std::string_view text, std::vector<int32_t>& out, bool allow_special) const;
  void encode_section(const std::vector<std::string>& pieces, PieceCache& cache,
                      std::vector<int32_t>& out) const;
  void encode_cached(std::string_view piece, PieceCache& cache, std::vector<int32_t>& out) const;
  void encode_words(std::string_view piece, PieceCache& cache, std::vector<int32_t>& out) const;
  void encode_chars(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_unigram(std::string_view piece, std::vector<int32_t>& out) const;
  void fuse_unknown(std::vector<int32_t>& out, size_t from) const;
  void append_unknown(std::string_view ch, std::vector<int32_t>& out) const;
  const std::string& token_string(int32_t id) const;
  void merge_short(int32_t* ids, size_t n, std::vector<int32_t>& out) const;
  void merge_long(const int32_t* ids, size_t n, std::vector<int32_t>& out) const;
  // (rank << 32 | merged id) for the pair, or ~0 if the pair does not merge.
  uint64_t pair_rank(int32_t left, int32_t right) const {
    const uint64_t* v = pairs_.find((uint64_t(uint32_t(left)) << 32) | uint32_t(right));
    return v ? *v : ~uint64_t(0);
  }

  std::vector<std::string> tokens_;  // id -> bytes for ordinary tokens
  BytesMap by_bytes_;                // bytes -> id
  U64Map pairs_;                     // (left, right) -> (rank, merged)
  int32_t byte_id_[256] = {};
  bool merge_rule_ = false;  // GPT-2 merge-list rule
  bool whole_piece_ = true;  // a piece that is a token is that token (not GPT-2's rule)
  bool nfc_ = false;         // NFC before pre-tokenisation
  std::vector<std::pair<int32_t, int32_t>> merge_list_;
  PreTokenizer pre_ = PreTokenizer::Gpt2;
  SpecialTokens specials_;
  std::vector<int32_t> special_of_id_;  // id -> index into specials_ or -1
  bool special_first_byte_[256] = {};
  // A byte trie over the special tokens' texts (Gemma's file has 6000 starting with '<').
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> node
    int32_t special = -1;                           // index into specials_ ending here
  };
  std::vector<TrieNode> special_trie_;
  // Index into specials_ of the longest special token starting at text[i], or -1; raw_only
  // leaves out the added tokens matched in normalized text (HfPipeline::normalized_added).
  int32_t match_special(std::string_view text, size_t i, bool raw_only = false) const;
  std::vector<bool> special_normalized_;  // by index into specials_
  // Unigram: scores by id and a byte trie over the tokens' texts, edges (node << 8 | byte) ->
  // child, unigram_id_[node] the token ending there or -1.
  std::vector<double> scores_;
  double unk_score_ = 0;
  U64Map unigram_next_;
  std::vector<int32_t> unigram_id_;
  int32_t vocab_size_ = 0;
  uint64_t serial_ = 0;  // identifies this vocabulary to the per-thread caches
  std::shared_ptr<const HfPipeline> hf_;
  std::shared_ptr<const TokenizerBackend> backend_;
};

// Loads a tokenizer from a spec: "gpt2:DIR" (encoder.json + vocab.bpe), "tiktoken:FILE",
// "loom:DIR" (saved by save_loom_tokenizer), "hf:PATH" (a Hugging Face tokenizer.json, or a
// folder holding one: hf_tokenizer.h), "spm:PATH" (a SentencePiece tokenizer.model, or a folder
// holding one: spm_tokenizer.h), or a bare path whose kind is detected (a .json file or a folder
// with tokenizer.json but no tokenizer.tiktoken is Hugging Face's; a .model file or a folder
// with only tokenizer.model SentencePiece's).
// tiktoken files get their pre-tokeniser and special tokens from a sidecar FILE.json
// ({"pretokenizer": "cl100k", "special_tokens": {"<|endoftext|>": 100257}}) if present, else
// from the known names gpt2/r50k_base/p50k_base/cl100k_base, else gpt2 rules with
// <|endoftext|> after the last rank.
std::unique_ptr<BpeTokenizer> load_tokenizer(const std::string& spec);
BpeTokenizer load_gpt2_tokenizer(const std::string& dir);
BpeTokenizer load_tiktoken(const std::string& path, PreTokenizer pre, SpecialTokens specials);
BpeTokenizer load_tiktoken(const std::string& path);  // settings as for "tiktoken:FILE"

// Saves DIR/tokenizer.tiktoken (ranks, loadable by tiktoken itself) and DIR/tokenizer.json
// (pre-tokeniser and special tokens). Both writes are atomic.
void save_loom_tokenizer(const BpeTokenizer& tok, const std::string& dir);
BpeTokenizer load_loom_tokenizer(const std::string& dir);

// The byte tokenizer of synthetic chat data (benchmarks, tests): ids 0..255 the bytes, no
// merges, GPT-2 pre-tokenisation, and ChatML's markers as specials (<|endoftext|> 256,
// <|im_start|> 257, <|im_end|> 258).
BpeTokenizer byte_chatml_tokenizer();

// Writes ranks as "base64(bytes) rank" lines, the tiktoken format.
std::string tiktoken_text(const BpeTokenizer& tok);

}  // namespace loom::data
