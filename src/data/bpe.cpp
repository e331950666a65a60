#include "data/bpe.h"

#include <algorithm>
#include <atomic>
#include <queue>

#include "core/error.h"
#include "data/normalize.h"

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
    PreTokenizer pre, SpecialTokens specials, bool ignore_merges) {
  BpeTokenizer t;
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

void BpeTokenizer::init_common() {
  serial_ = g_next_serial.fetch_add(1);
  by_bytes_.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].empty()) continue;
    LOOM_CHECK(by_bytes_.insert(tokens_[id], int32_t(id)), "token ", id,
               " repeats the bytes of an earlier token");
  }
  for (int b = 0; b < 256; ++b) {
    const int32_t* id = by_bytes_.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    LOOM_CHECK(id, "vocabulary has no token for byte ", b, ": not a byte-level BPE vocabulary");
    byte_id_[b] = *id;
  }
  vocab_size_ = int32_t(tokens_.size());
  for (auto& [text, id] : specials_) {
    LOOM_CHECK(!text.empty() && id >= 0, "bad special token '", text, "' = ", id);
    LOOM_CHECK(size_t(id) >= tokens_.size() || tokens_[size_t(id)].empty(), "special token '", text,
               "' reuses the id ", id, " of an ordinary token");
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
}

int32_t BpeTokenizer::special_id(std::string_view text) const {
  for (auto& [s, id] : specials_)
    if (s == text) return id;
  return -1;
}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out,
                          bool allow_special) const {
  if (!allow_special || specials_.empty()) return encode_ordinary(text, out);
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!special_first_byte_[uint8_t(text[i])]) continue;
    for (auto& [s, id] : specials_) {
      if (text.compare(i, s.size(), s) != 0) continue;
      encode_ordinary(text.substr(start, i - start), out);
      out.push_back(id);
      start = i + s.size();
      i = start - 1;
      break;
    }
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
  ThreadCache& tc = thread_cache(serial_);
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
    if (whole_piece_) {  // tiktoken: a piece that is a token is that token
      if (const int32_t* id = by_bytes_.find(piece)) {
        out.push_back(*id);
        continue;
      }
    }
    if (piece.size() > kMaxCachedPiece) {
      encode_piece(piece, out);
      continue;
    }
    uint64_t h = hash_bytes(piece.data(), piece.size());
    if (tc.cache.get(piece, h, out)) continue;
    size_t before = out.size();
    encode_piece(piece, out);
    tc.cache.put(piece, h, out.data() + before, out.size() - before);
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

void BpeTokenizer::decode_append(int32_t id, std::string& out) const {
  LOOM_CHECK(id >= 0 && id < vocab_size_, "token id ", id, " is outside the vocabulary (size ",
             vocab_size_, ")");
  if (size_t(id) < tokens_.size() && !tokens_[size_t(id)].empty()) {
    out += tokens_[size_t(id)];
    return;
  }
  int32_t k = special_of_id_[size_t(id)];
  LOOM_CHECK(k >= 0, "token id ", id, " is not used by this vocabulary");
  out += specials_[size_t(k)].first;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) decode_append(id, out);
  return out;
}

BpeTokenizer byte_chatml_tokenizer() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
  SpecialTokens sp = {{"<|endoftext|>", 256}, {"<|im_start|>", 257}, {"<|im_end|>", 258}};
  return BpeTokenizer::from_ranks(tokens, PreTokenizer::Gpt2, sp);
}

}  // namespace loom::data
