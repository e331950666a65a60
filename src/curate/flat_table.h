// Open-addressing hash tables for the per-document counting in the filters (n-gram classes,
// duplicate lines). They are meant to live in thread_local scratch and be reused for every
// document: reset() is O(1) (an epoch bump), so a document touches only the slots it uses and
// allocates nothing once the table has grown to the largest document seen.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace loom::curate {

class FlatTable {
 public:
  struct Slot {
    uint64_t key;
    uint32_t value;  // the index of the first element with this key
    uint32_t epoch;  // the slot is in use when it equals the table's epoch
  };

  // Empties the table and makes room for `expected` keys at a load factor of at most 1/2.
  void reset(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    // Grow when needed; shrink after an enormous document so a worker does not keep its table.
    bool shrink = slots_.size() > (size_t{1} << 20) && slots_.size() > 8 * cap;
    if (cap > slots_.size() || shrink || epoch_ == UINT32_MAX) {
      if (cap < slots_.size() && !shrink) cap = slots_.size();
      slots_.assign(cap, Slot{0, 0, 0});
      shift_ = 64;
      for (size_t c = cap; c > 1; c >>= 1) --shift_;
      mask_ = cap - 1;
      epoch_ = 0;
    }
    ++epoch_;
  }

  // The value of `key`, or `fresh` (stored as its value) if it was absent. Branch-free past
  // the probe: whether a key is new is unpredictable, and a mispredicted branch per key costs
  // more than the table access.
  uint32_t find_or_assign(uint64_t key, uint32_t fresh) {
    size_t i = index(key);
    while (slots_[i].epoch == epoch_ && slots_[i].key != key) i = (i + 1) & mask_;
    Slot& s = slots_[i];
    uint32_t value = s.epoch == epoch_ ? s.value : fresh;
    s = Slot{key, value, epoch_};
    return value;
  }

  // Loads the slot where a probe for `key` starts: a batch of lookups that prefetches a few
  // keys ahead overlaps the cache misses of large tables instead of waiting on each in turn.
  void prefetch(uint64_t key) const { __builtin_prefetch(&slots_[index(key)]); }

  // Like find_or_insert for keys that are hashes of longer values: same(value) decides whether
  // an occupied slot with an equal hash holds an equal element; if not, probing continues, so
  // hash collisions never merge different elements. Returns the slot holding `value` for the
  // first equal element, or a new slot whose value is set to `value`.
  template <class Same>
  Slot& find_or_insert_checked(uint64_t key, uint32_t value, Same same, bool& inserted) {
    size_t i = index(key);
    for (;;) {
      Slot& s = slots_[i];
      if (s.epoch != epoch_) {
        s.key = key;
        s.value = value;
        s.epoch = epoch_;
        inserted = true;
        return s;
      }
      if (s.key == key && same(s.value)) {
        inserted = false;
        return s;
      }
      i = (i + 1) & mask_;
    }
  }

 private:
  // Fibonacci hashing: the top bits of key * 2^64/phi, good even for poorly mixed keys.
  size_t index(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  std::vector<Slot> slots_;
  uint32_t epoch_ = 0;
  int shift_ = 64;
  size_t mask_ = 0;
};

}  // namespace loom::curate
