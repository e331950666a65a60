// Small open-addressing hash tables for the tokenizer's hot paths: (left id, right id) ->
// merge, token bytes -> id, and the per-thread piece cache. std::unordered_map allocates per
// node and hashes strings slowly; these keep keys in flat arrays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

inline uint64_t hash_bytes(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ mix64(w)) * 0x9E3779B97F4A7C15ULL;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  return mix64(h ^ w ^ (uint64_t(n) << 56));
}

inline size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

// uint64 key -> uint64 value. Key ~0 is reserved (empty slot).
class U64Map {
 public:
  void reserve(size_t n) {
    keys_.assign(pow2_at_least(n * 2), kEmpty);
    vals_.assign(keys_.size(), 0);
    size_ = 0;
  }
  void insert(uint64_t key, uint64_t val) {
    if ((size_ + 1) * 2 > keys_.size()) grow();
    size_t mask = keys_.size() - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        vals_[i] = val;
        ++size_;
        return;
      }
      if (keys_[i] == key) {
        vals_[i] = val;
        return;
      }
    }
  }
  const uint64_t* find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    size_t mask = keys_.size() - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  void grow() {
    std::vector<uint64_t> k = std::move(keys_), v = std::move(vals_);
    reserve(k.empty() ? 16 : k.size());
    for (size_t i = 0; i < k.size(); ++i)
      if (k[i] != kEmpty) insert(k[i], v[i]);
  }
  std::vector<uint64_t> keys_, vals_;
  size_t size_ = 0;
};

// Byte string -> int32 value; keys are copied into one arena.
class BytesMap {
 public:
  void reserve(size_t n) { slots_.assign(pow2_at_least(n * 2), Slot{}); }
  // Returns false (and leaves the old value) if the key is already present.
  bool insert(std::string_view key, int32_t val) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    uint64_t h = hash_bytes(key.data(), key.size());
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.len < 0) {
        s = Slot{h, arena_.size(), int32_t(key.size()), val};
        arena_.append(key);
        ++size_;
        return true;
      }
      if (s.hash == h && key_of(s) == key) return false;
    }
  }
  const int32_t* find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    uint64_t h = hash_bytes(key.data(), key.size());
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.len < 0) return nullptr;
      if (s.hash == h && key_of(s) == key) return &s.val;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    size_t off = 0;
    int32_t len = -1;  // -1: empty
    int32_t val = 0;
  };
  std::string_view key_of(const Slot& s) const {
    return std::string_view(arena_.data() + s.off, size_t(s.len));
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 16 : old.size() * 2, Slot{});
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.len < 0) continue;
      size_t i = s.hash & mask;
      while (slots_[i].len >= 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// Piece bytes -> token ids, bounded: cleared when full (a corpus's common words come back
// within a few thousand pieces, so a periodic reset costs little).
class PieceCache {
 public:
  explicit PieceCache(size_t max_entries = 1 << 16) : max_(max_entries) { clear(); }
  void clear() {
    slots_.assign(pow2_at_least(max_ * 2), Slot{});
    keys_.clear();
    ids_.clear();
    size_ = 0;
  }
  // Appends the cached ids for piece to out and returns true, or returns false.
  bool get(std::string_view piece, uint64_t h, std::vector<int32_t>& out) const {
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key_len < 0) return false;
      if (s.hash == h && size_t(s.key_len) == piece.size() &&
          std::memcmp(keys_.data() + s.key_off, piece.data(), piece.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.n_ids);
        return true;
      }
    }
  }
  void put(std::string_view piece, uint64_t h, const int32_t* ids, size_t n) {
    if (size_ >= max_ || keys_.size() > (max_ << 6)) clear();
    size_t mask = slots_.size() - 1;
    size_t i = h & mask;
    while (slots_[i].key_len >= 0) i = (i + 1) & mask;
    slots_[i] =
        Slot{h, uint32_t(keys_.size()), int32_t(piece.size()), uint32_t(ids_.size()), uint32_t(n)};
    keys_.append(piece);
    ids_.insert(ids_.end(), ids, ids + n);
    ++size_;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0;
    int32_t key_len = -1;  // -1: empty
    uint32_t ids_off = 0, n_ids = 0;
  };
  size_t max_;
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t size_ = 0;
};

}  // namespace loom::data
