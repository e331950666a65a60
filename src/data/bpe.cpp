#include "data/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <queue>

#include "core/error.h"
#include "data/hf_pipeline.h"
#include "data/normalize.h"
#include "data/unicode.h"

namespace loom::data {

namespace {

constexpr uint64_t kNoMerge = ~uint64_t(0);
constexpr size_t kMaxCachedPiece = 128;  // longer pieces are rare; caching them wastes space
constexpr size_t kShortPiece = 64;       // above this, merge with a heap (O(n log n))

std::atomic<uint64_t> g_next_serial{1};

struct ThreadCache {
  uint64_t owner = 0;
  PieceCache cache;
  std::vector<int32_t> scratch;
};

ThreadCache& thread_cache(uint64_t owner) {
  thread_local ThreadCache tc;
  if (tc.owner != owner) {
    tc.cache.clear();
    tc.owner = owner;
  }
  return tc;
}

}  // namespace

BpeTokenizer BpeTokenizer::from_ranks(std::vector<std::string> tokens, PreTokenizer pre,
                                      SpecialTokens specials) {
  BpeTokenizer t;
  t.tokens_ = std::move(tokens);
  t.pre_ = pre;
  t.specials_ = std::move(specials);
  t.init_common();
  // Every way of writing a token as two tokens is a merge with the token's rank.
  t.pairs_.reserve(t.tokens_.size() * 4);
  for (size_t id = 0; id < t.tokens_.size(); ++id) {
    std::string_view b = t.tokens_[id];
    for (size_t k = 1; k < b.size(); ++k) {
      const int32_t* l = t.by_bytes_.find(b.substr(0, k));
      if (!l) continue;
      const int32_t* r = t.by_bytes_.find(b.substr(k));
      if (!r) continue;
      t.pairs_.insert((uint64_t(uint32_t(*l)) << 32) | uint32_t(*r), (uint64_t(id) << 32) | id);
      t.merge_list_.emplace_back(*l, *r);
    }
  }
  return t;
}

BpeTokenizer BpeTokenizer::from_merges(
    std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
    PreTokenizer pre, SpecialTokens specials, bool ignore_merges,
    std::shared_ptr<const HfPipeline> pipeline) {
  BpeTokenizer t;
  t.hf_ = std::move(pipeline);
  t.tokens_ = std::move(tokens);
  t.pre_ = pre;
  t.specials_ = std::move(specials);
  t.merge_rule_ = true;
  t.whole_piece_ = ignore_merges;
  t.init_common();
  t.pairs_.reserve(merges.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    auto& [a, b] = merges[k];
    const int32_t* l = t.by_bytes_.find(a);
    const int32_t* r = t.by_bytes_.find(b);
    const int32_t* m = t.by_bytes_.find(a + b);
    LOOM_CHECK(l && r && m, "merge ", k + 1, " ('", a, "' + '", b,
               "') uses or makes a token that is not in the vocabulary");
    uint64_t key = (uint64_t(uint32_t(*l)) << 32) | uint32_t(*r);
    if (t.pairs_.find(key)) continue;  // a repeated merge keeps its first rank
    t.pairs_.insert(key, (uint64_t(k) << 32) | uint32_t(*m));
    t.merge_list_.emplace_back(*l, *r);
  }
  return t;
}

BpeTokenizer BpeTokenizer::from_unigram(std::vector<std::string> tokens, std::vector<double> scores,
                                        SpecialTokens specials,
                                        std::shared_ptr<const HfPipeline> pipeline) {
  LOOM_CHECK(pipeline && pipeline->char_model, "a Unigram model needs a text vocabulary");
  LOOM_CHECK(scores.size() == tokens.size() && !tokens.empty(),
             "a Unigram model needs one score per token (", tokens.size(), " tokens, ",
             scores.size(), " scores)");
  BpeTokenizer t;
  t.hf_ = std::move(pipeline);
  t.tokens_ = std::move(tokens);
  t.pre_ = PreTokenizer::Gpt2;
  t.specials_ = std::move(specials);
  t.whole_piece_ = false;
  t.init_common();
  double lowest = scores[0];
  for (double s : scores) lowest = std::min(lowest, s);
  t.unk_score_ = lowest - 10.0;  // SentencePiece's kUnkPenalty
  const int32_t unk = t.hf_->unk_id;
  LOOM_CHECK(unk < int32_t(t.tokens_.size()), "the Unigram model's unk_id ", unk,
             " is outside its vocabulary of ", t.tokens_.size());
  if (unk >= 0) scores[size_t(unk)] = t.unk_score_;
  t.scores_ = std::move(scores);
  t.unigram_id_.assign(1, -1);
  t.unigram_next_.reserve(t.tokens_.size() * 4);
  // Special added tokens are cut out of the text before the model when specials are allowed;
  // when they are not, their text is ordinary text, which the model must not turn into their
  // ids (nor does SentencePiece, whose lattice leaves control pieces out).
  std::vector<bool> special(t.tokens_.size(), false);
  for (int32_t id : t.hf_->special_ids)
    if (size_t(id) < special.size()) special[size_t(id)] = true;
  for (size_t id = 0; id < t.tokens_.size(); ++id) {
    if (special[id]) continue;
    uint64_t node = 0;
    for (char c : t.tokens_[id]) {
      const uint64_t key = (node << 8) | uint8_t(c);
      if (const uint64_t* next = t.unigram_next_.find(key)) {
        node = *next;
        continue;
      }
      t.unigram_next_.insert(key, t.unigram_id_.size());
      node = t.unigram_id_.size();
      t.unigram_id_.push_back(-1);
    }
    if (node != 0) t.unigram_id_[node] = int32_t(id);
  }
  return t;
}

BpeTokenizer BpeTokenizer::from_backend(std::vector<std::string> tokens, SpecialTokens specials,
                                        std::shared_ptr<const HfPipeline> pipeline,
                                        std::shared_ptr<const TokenizerBackend> backend) {
  LOOM_CHECK(pipeline && pipeline->char_model && backend,
             "a tokenizer backend needs a text vocabulary's pipeline");
  BpeTokenizer t;
  t.hf_ = std::move(pipeline);
  t.backend_ = std::move(backend);
  t.tokens_ = std::move(tokens);
  t.specials_ = std::move(specials);
  t.whole_piece_ = false;
  t.init_common();
  return t;
}

void BpeTokenizer::init_common() {
  serial_ = g_next_serial.fetch_add(1);
  by_bytes_.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].empty()) continue;
    LOOM_CHECK(by_bytes_.insert(tokens_[id], int32_t(id)), "token ", id,
               " repeats the bytes of an earlier token");
  }
  for (int b = 0; b < 256; ++b) {
    if (!byte_level()) {  // byte fallback: the <0xNN> tokens, where the vocabulary has them
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      const int32_t* id = by_bytes_.find(name);
      byte_id_[b] = id ? *id : -1;
      continue;
    }
    const int32_t* id = by_bytes_.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    LOOM_CHECK(id, "vocabulary has no token for byte ", b, ": not a byte-level BPE vocabulary");
    byte_id_[b] = *id;
  }
  vocab_size_ = int32_t(tokens_.size());
  for (auto& [text, id] : specials_) {
    LOOM_CHECK(!text.empty() && id >= 0, "bad special token '", text, "' = ", id);
    // A SentencePiece-style vocabulary's added token may also be the ordinary token of the
    // same text.
    LOOM_CHECK(size_t(id) >= tokens_.size() || tokens_[size_t(id)].empty() ||
                   (!byte_level() && tokens_[size_t(id)] == text),
               "special token '", text, "' reuses the id ", id, " of an ordinary token");
    vocab_size_ = std::max(vocab_size_, id + 1);
  }
  special_of_id_.assign(size_t(vocab_size_), -1);
  // Longest first, so a special that is a prefix of another never shadows it.
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
  for (size_t k = 0; k < specials_.size(); ++k) {
    LOOM_CHECK(special_of_id_[size_t(specials_[k].second)] < 0, "special id ", specials_[k].second,
               " used twice");
    special_of_id_[size_t(specials_[k].second)] = int32_t(k);
    special_first_byte_[uint8_t(specials_[k].first[0])] = true;
  }
  special_normalized_.assign(specials_.size(), false);
  if (hf_)
    for (size_t k = 0; k < specials_.size(); ++k)
      for (const auto& [pattern, id] : hf_->normalized_added)
        special_normalized_[k] = special_normalized_[k] || id == specials_[k].second;
  special_trie_.assign(1, TrieNode{});
  for (size_t k = 0; k < specials_.size(); ++k) {
    int32_t node = 0;
    for (char c : specials_[k].first) {
      auto& next = special_trie_[size_t(node)].next;
      auto it =
          std::find_if(next.begin(), next.end(), [&](auto& e) { return e.first == uint8_t(c); });
      if (it != next.end()) {
        node = it->second;
        continue;
      }
      next.emplace_back(uint8_t(c), int32_t(special_trie_.size()));
      node = int32_t(special_trie_.size());
      special_trie_.emplace_back();
    }
    special_trie_[size_t(node)].special = int32_t(k);
  }
}

int32_t BpeTokenizer::match_special(std::string_view text, size_t i, bool raw_only) const {
  int32_t node = 0, found = -1;
  for (; i < text.size(); ++i) {
    const auto& next = special_trie_[size_t(node)].next;
    auto it = std::find_if(next.begin(), next.end(),
                           [&](auto& e) { return e.first == uint8_t(text[i]); });
    if (it == next.end()) break;
    node = it->second;
    const int32_t k = special_trie_[size_t(node)].special;
    if (k >= 0 && !(raw_only && special_normalized_[size_t(k)])) found = k;
  }
  return found;
}

int32_t BpeTokenizer::special_id(std::string_view text) const {
  for (auto& [s, id] : specials_)
    if (s == text) return id;
  return -1;
}

bool BpeTokenizer::byte_level() const {
  return !hf_ || !hf_->char_model;
}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out,
                          bool allow_special) const {
  if (backend_) {
    size_t start = 0;
    for (size_t i = 0; allow_special && i < text.size(); ++i) {
      if (!special_first_byte_[uint8_t(text[i])]) continue;
      const int32_t k = match_special(text, i);
      if (k < 0) continue;
      const auto& [s, id] = specials_[size_t(k)];
      if (i > start) backend_->encode(text.substr(start, i - start), out);
      out.push_back(id);
      start = i + s.size();
      i = start - 1;
    }
    if (start < text.size()) backend_->encode(text.substr(start), out);
    return;
  }
  if (hf_ && hf_->runs_encode) return encode_pipeline(text, out, allow_special);
  if (!allow_special || specials_.empty()) return encode_ordinary(text, out);
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!special_first_byte_[uint8_t(text[i])]) continue;
    const int32_t k = match_special(text, i);
    if (k < 0) continue;
    const auto& [s, id] = specials_[size_t(k)];
    encode_ordinary(text.substr(start, i - start), out);
    out.push_back(id);
    start = i + s.size();
    i = start - 1;
  }
  encode_ordinary(text.substr(start), out);
}

void BpeTokenizer::set_nfc(bool on) {
  LOOM_CHECK(!on || nfc_available(),
             "NFC normalisation needs utf8proc, which this build did not find (scripts/setup.sh)");
  nfc_ = on;
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  if (nfc_) {
    const std::string normal = data::nfc(text);
    if (normal != text) return encode_normalized(normal, out);
  }
  encode_normalized(text, out);
}

void BpeTokenizer::encode_normalized(std::string_view text, std::vector<int32_t>& out) const {
  PieceCache& cache = thread_cache(serial_).cache;
  const uint8_t* s = reinterpret_cast<const uint8_t*>(text.data());
  size_t n = text.size();
  for (size_t i = 0; i < n;) {
    size_t j = next_piece(pre_, s, n, i);
    std::string_view piece = text.substr(i, j - i);
    i = j;
    if (piece.size() == 1) {
      out.push_back(byte_id_[uint8_t(piece[0])]);
      continue;
    }
    encode_cached(piece, cache, out);
  }
}

void BpeTokenizer::encode_cached(std::string_view piece, PieceCache& cache,
                                 std::vector<int32_t>& out) const {
  if (whole_piece_) {  // tiktoken: a piece that is a token is that token
    if (const int32_t* id = by_bytes_.find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  auto run = [&] {
    if (unigram())
      encode_unigram(piece, out);
    else if (!byte_level())
      encode_chars(piece, out);
    else
      encode_piece(piece, out);
  };
  if (piece.size() > kMaxCachedPiece) return run();
  uint64_t h = hash_bytes(piece.data(), piece.size());
  if (cache.get(piece, h, out)) return;
  size_t before = out.size();
  run();
  cache.put(piece, h, out.data() + before, out.size() - before);
}

namespace {

struct Section {
  std::string text;
  int32_t id;  // an added token's id, or -1 for text
};

bool has_id(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// A word character as Hugging Face's single_word tests it (\w): a letter, a digit, '_', or the
// joiners U+200C/U+200D.
bool word_char(uint32_t cp) {
  const CharClass c = char_class(cp);
  return c == CharClass::Letter || c == CharClass::Number || cp == '_' || cp == 0x200C ||
         cp == 0x200D;
}

bool word_before(std::string_view s, size_t at) {
  if (at == 0) return false;
  size_t k = at - 1;
  while (k > 0 && (uint8_t(s[k]) & 0xC0) == 0x80) --k;
  uint32_t cp;
  utf8_decode(reinterpret_cast<const uint8_t*>(s.data()) + k, s.size() - k, &cp);
  return word_char(cp);
}

bool word_after(std::string_view s, size_t at) {
  if (at >= s.size()) return false;
  uint32_t cp;
  utf8_decode(reinterpret_cast<const uint8_t*>(s.data()) + at, s.size() - at, &cp);
  return word_char(cp);
}

// Cuts the added tokens `match` finds out of `text` (leftmost, longest), as Hugging Face's
// AddedVocabulary does: a single_word token next to a word character is no match (and the
// search goes on after it), lstrip/rstrip take the white space beside a token from the text.
template <class Match>
void cut_added(const std::string& text, const HfPipeline& hf, Match match,
               std::vector<Section>& out) {
  const size_t first = out.size();
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    size_t len = 0;
    const int32_t id = match(text, i, &len);
    if (len == 0) continue;
    if (has_id(hf.single_word_ids, id) && (word_before(text, i) || word_after(text, i + len))) {
      i += len - 1;
      continue;
    }
    if (i > start) out.push_back({text.substr(start, i - start), -1});
    out.push_back({text.substr(i, len), id});
    start = i + len;
    i = start - 1;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  for (size_t k = first; k < out.size(); ++k) {
    if (out[k].id < 0) continue;
    if (k > first && out[k - 1].id < 0 && has_id(hf.lstrip_ids, out[k].id))
      out[k - 1].text = js_trim(out[k - 1].text, false, true);
    if (k + 1 < out.size() && out[k + 1].id < 0 && has_id(hf.rstrip_ids, out[k].id))
      out[k + 1].text = js_trim(out[k + 1].text, true, false);
  }
}

}  // namespace

// tokenizer.json's order: added tokens that are not `normalized` are cut out of the raw text
// first (longest match at each position), their lstrip/rstrip take the white space beside them;
// each remaining section is normalized, its `normalized` added tokens (matched by their
// normalized text) are cut out the same way, and each remaining piece is pre-tokenized and
// encoded on its own.
void BpeTokenizer::encode_pipeline(std::string_view raw, std::vector<int32_t>& out,
                                   bool allow_special) const {
  const std::string text = utf8_replace_invalid(raw);
  std::vector<Section> sections;
  if (allow_special) {
    cut_added(
        text, *hf_,
        [&](const std::string& t, size_t i, size_t* len) {
          if (!special_first_byte_[uint8_t(t[i])]) return -1;
          const int32_t k = match_special(t, i, /*raw_only=*/true);
          if (k < 0) return -1;
          *len = specials_[size_t(k)].first.size();
          return specials_[size_t(k)].second;
        },
        sections);
  } else if (!text.empty()) {
    sections.push_back({text, -1});
  }
  auto match_normalized = [&](const std::string& t, size_t i, size_t* len) {
    int32_t id = -1;
    for (const auto& [pattern, pid] : hf_->normalized_added)
      if (pattern.size() > *len && t.compare(i, pattern.size(), pattern) == 0)
        *len = pattern.size(), id = pid;
    return id;
  };
  std::vector<std::string> pieces;
  std::vector<Section> parts;
  PieceCache& cache = thread_cache(serial_).cache;
  for (size_t k = 0; k < sections.size(); ++k) {
    if (sections[k].id >= 0) {
      out.push_back(sections[k].id);
      continue;
    }
    if (sections[k].text.empty()) continue;
    const std::string normal = hf_->normalize(std::move(sections[k].text));
    if (normal.empty()) continue;
    parts.clear();
    if (allow_special && !hf_->normalized_added.empty())
      cut_added(normal, *hf_, match_normalized, parts);
    else
      parts.push_back({normal, -1});
    for (size_t j = 0; j < parts.size(); ++j) {
      if (parts[j].id >= 0) {
        out.push_back(parts[j].id);
        continue;
      }
      if (parts[j].text.empty()) continue;
      pieces.clear();
      hf_->pre_tokenize(parts[j].text, k == 0 && j == 0, pieces);
      encode_section(pieces, cache, out);
    }
  }
}

// The model over one section's pre-tokenized pieces.
void BpeTokenizer::encode_section(const std::vector<std::string>& pieces, PieceCache& cache,
                                  std::vector<int32_t>& out) const {
  const size_t section_start = out.size();
  for (const std::string& p : pieces) {
    if (unigram()) {
      encode_cached(p, cache, out);
      continue;
    }
    if (!byte_level()) {
      encode_words(p, cache, out);
      continue;
    }
    if (p.size() == 1) {
      out.push_back(byte_id_[uint8_t(p[0])]);
      continue;
    }
    encode_cached(p, cache, out);
  }
  if (unigram()) fuse_unknown(out, section_start);
}

// Consecutive unknown tokens of one section become one (transformers.js's and SentencePiece's
// fuse_unk, always on for Unigram models).
void BpeTokenizer::fuse_unknown(std::vector<int32_t>& out, size_t from) const {
  const int32_t unk = hf_->unk_id;
  if (unk < 0) return;
  size_t w = from;
  for (size_t r = from; r < out.size(); ++r)
    if (out[r] != unk || w == from || out[w - 1] != unk) out[w++] = out[r];
  out.resize(w);
}

// Viterbi over the tokens each character starts (SentencePiece's and transformers.js's rule:
// the path of the highest total score; on ties the token that starts first).
void BpeTokenizer::encode_unigram(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  struct Best {
    double score = 0;
    int64_t start = -1;  // where the token ending here starts; -1: not reached
    int32_t id = -1;     // -1: an unknown character
  };
  std::vector<Best> best(n + 1);
  best[0].start = 0;
  const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
  for (size_t pos = 0; pos < n;) {
    uint32_t cp;
    const size_t len = p[pos] < 0x80 ? 1 : std::max<size_t>(1, utf8_decode(p + pos, n - pos, &cp));
    const double here = best[pos].score;
    auto offer = [&](size_t end, double score, int32_t id) {
      Best& b = best[end];
      if (b.start < 0 || here + score > b.score) b = {here + score, int64_t(pos), id};
    };
    bool single = false;
    uint64_t node = 0;
    for (size_t k = pos; k < n; ++k) {
      const uint64_t* next = unigram_next_.find((node << 8) | p[k]);
      if (!next) break;
      node = *next;
      const int32_t id = unigram_id_[node];
      if (id < 0) continue;
      offer(k + 1, scores_[size_t(id)], id);
      single |= k + 1 - pos == len;
    }
    if (!single) offer(pos + len, unk_score_, -1);
    pos += len;
  }
  std::vector<std::pair<size_t, int32_t>> path;  // (start, id)
  for (size_t end = n; end > 0; end = size_t(best[end].start))
    path.emplace_back(size_t(best[end].start), best[end].id);
  for (size_t k = path.size(); k-- > 0;) {
    const auto [start, id] = path[k];
    const size_t stop = k > 0 ? path[k - 1].first : n;
    if (id >= 0)
      out.push_back(id);
    else
      append_unknown(piece.substr(start, stop - start), out);
  }
}

// A character outside the vocabulary: its bytes' <0xNN> tokens with byte_fallback (when the
// vocabulary has them all), else the unknown token.
void BpeTokenizer::append_unknown(std::string_view ch, std::vector<int32_t>& out) const {
  bool all = hf_->byte_fallback;
  for (char b : ch) all &= byte_id_[uint8_t(b)] >= 0;
  if (all) {
    for (char b : ch) out.push_back(byte_id_[uint8_t(b)]);
    return;
  }
  LOOM_CHECK(hf_->unk_id >= 0, "the character '", ch,
             "' is not in the vocabulary, which has no byte fallback or unknown token");
  out.push_back(hf_->unk_id);
}

// Cuts a SentencePiece-style piece before each ▁ that no token reaches across
// (HfPipeline::joins_space_mark) and encodes the words one by one.
void BpeTokenizer::encode_words(std::string_view piece, PieceCache& cache,
                                std::vector<int32_t>& out) const {
  constexpr std::string_view kMark = "\u2581";
  size_t start = 0;
  for (size_t at = piece.find(kMark, 1); at != std::string_view::npos;
       at = piece.find(kMark, at + 1)) {
    size_t k = at - 1;
    while (k > 0 && (uint8_t(piece[k]) & 0xC0) == 0x80) --k;
    const std::string_view before = piece.substr(k, at - k);
    if (before == kMark || std::find(hf_->joins_space_mark.begin(), hf_->joins_space_mark.end(),
                                     before) != hf_->joins_space_mark.end())
      continue;
    encode_cached(piece.substr(start, at - start), cache, out);
    start = at;
  }
  encode_cached(piece.substr(start), cache, out);
}

// SentencePiece-style BPE: symbols start as characters; one outside the vocabulary takes no
// part in merges and becomes its bytes' <0xNN> tokens afterwards (or the unknown token when
// a byte token is missing), as transformers.js applies byte_fallback.
void BpeTokenizer::encode_chars(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> ids;
  std::vector<std::string_view> unknown;  // symbol -(k+1) is unknown[k]
  const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
  for (size_t i = 0; i < piece.size();) {
    uint32_t cp;
    const size_t len = p[i] < 0x80 ? 1 : size_t(utf8_decode(p + i, piece.size() - i, &cp));
    const std::string_view ch = piece.substr(i, len);
    i += len;
    if (const int32_t* id = by_bytes_.find(ch)) {
      ids.push_back(*id);
    } else {
      unknown.push_back(ch);
      ids.push_back(-int32_t(unknown.size()));
    }
  }
  std::vector<int32_t> merged;
  if (ids.size() <= kShortPiece)
    merge_short(ids.data(), ids.size(), merged);
  else
    merge_long(ids.data(), ids.size(), merged);
  for (int32_t id : merged) {
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    append_unknown(unknown[size_t(-id - 1)], out);
  }
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  size_t n = piece.size();
  if (n <= kShortPiece) {
    int32_t ids[kShortPiece];
    for (size_t k = 0; k < n; ++k) ids[k] = byte_id_[uint8_t(piece[k])];
    merge_short(ids, n, out);
    return;
  }
  std::vector<int32_t> ids(n);
  for (size_t k = 0; k < n; ++k) ids[k] = byte_id_[uint8_t(piece[k])];
  merge_long(ids.data(), n, out);
}

// O(n * merges) scan: fastest for the short pieces that make up nearly all text.
void BpeTokenizer::merge_short(int32_t* ids, size_t n, std::vector<int32_t>& out) const {
  uint64_t ranks[kShortPiece];
  for (size_t k = 0; k + 1 < n; ++k) ranks[k] = pair_rank(ids[k], ids[k + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < n; ++k)
      if ((ranks[k] >> 32) < (ranks[best] >> 32)) best = k;
    if (ranks[best] == kNoMerge) break;
    ids[best] = int32_t(uint32_t(ranks[best]));
    for (size_t k = best + 1; k + 1 < n; ++k) {
      ids[k] = ids[k + 1];
      ranks[k] = ranks[k + 1];
    }
    --n;
    if (best > 0) ranks[best - 1] = pair_rank(ids[best - 1], ids[best]);
    if (best + 1 < n) ranks[best] = pair_rank(ids[best], ids[best + 1]);
  }
  out.insert(out.end(), ids, ids + n);
}

// Same rule with a heap of candidate pairs and a linked list of symbols: O(n log n) for the
// long runs (base64 blobs, repeated characters) that would make the scan quadratic.
void BpeTokenizer::merge_long(const int32_t* init, size_t n, std::vector<int32_t>& out) const {
  std::vector<int32_t> id(init, init + n);
  std::vector<int64_t> prev(n), next(n);
  for (size_t k = 0; k < n; ++k) {
    prev[k] = int64_t(k) - 1;
    next[k] = k + 1 < n ? int64_t(k + 1) : -1;
  }
  struct Cand {
    uint32_t rank;
    int64_t pos;
    int32_t left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int64_t p) {
    if (p < 0 || next[size_t(p)] < 0) return;
    uint64_t r = pair_rank(id[size_t(p)], id[size_t(next[size_t(p)])]);
    if (r != kNoMerge)
      heap.push({uint32_t(r >> 32), p, id[size_t(p)], id[size_t(next[size_t(p)])]});
  };
  for (size_t k = 0; k + 1 < n; ++k) push(int64_t(k));
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    size_t p = size_t(c.pos);
    if (dead[p] || next[p] < 0 || id[p] != c.left || id[size_t(next[p])] != c.right) continue;
    size_t q = size_t(next[p]);
    id[p] = int32_t(uint32_t(pair_rank(c.left, c.right)));
    dead[q] = true;
    next[p] = next[q];
    if (next[q] >= 0) prev[size_t(next[q])] = int64_t(p);
    push(prev[p]);
    push(int64_t(p));
  }
  for (int64_t p = 0; p >= 0; p = next[size_t(p)]) out.push_back(id[size_t(p)]);
}

const std::string& BpeTokenizer::token_string(int32_t id) const {
  LOOM_CHECK(id >= 0 && id < vocab_size_, "token id ", id, " is outside the vocabulary (size ",
             vocab_size_, ")");
  if (size_t(id) < tokens_.size() && !tokens_[size_t(id)].empty()) return tokens_[size_t(id)];
  int32_t k = special_of_id_[size_t(id)];
  LOOM_CHECK(k >= 0, "token id ", id, " is not used by this vocabulary");
  return specials_[size_t(k)].first;
}

void BpeTokenizer::decode_append(int32_t id, std::string& out) const {
  const std::string& s = token_string(id);
  if (byte_level())
    out += s;
  else
    out += hf_->token_text(s);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  if (backend_) {
    for (int32_t id : ids) token_string(id);  // checks the ids
    return backend_->decode(ids);
  }
  if (!byte_level()) {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) tokens.push_back(token_string(id));
    return hf_->decode(std::move(tokens));
  }
  for (int32_t id : ids) decode_append(id, out);
  return out;
}

void BpeTokenizer::post_process(std::vector<int32_t>& ids) const {
  if (!hf_) return;
  ids.insert(ids.begin(), hf_->prefix.begin(), hf_->prefix.end());
  ids.insert(ids.end(), hf_->suffix.begin(), hf_->suffix.end());
}

BpeTokenizer byte_chatml_tokenizer() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
  SpecialTokens sp = {{"<|endoftext|>", 256}, {"<|im_start|>", 257}, {"<|im_end|>", 258}};
  return BpeTokenizer::from_ranks(tokens, PreTokenizer::Gpt2, sp);
}

}  // namespace loom::data
