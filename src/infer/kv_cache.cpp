#include "infer/kv_cache.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace loom::infer {

namespace {

// The spare pool (kv_cache.h): one, taken only at its exact size (a pool never grows or
// shrinks under a cache's views), guarded for engines built on different threads.
std::mutex g_spare_mu;
cpu::HugeBuffer g_spare;

cpu::HugeBuffer take_pool(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(g_spare_mu);
    if (g_spare.size() == bytes) return std::move(g_spare);
  }
  return cpu::HugeBuffer(bytes);
}

}  // namespace

size_t KvCache::spare_pool_bytes() {
  std::lock_guard<std::mutex> lock(g_spare_mu);
  return g_spare.size();
}

void KvCache::release_spare_pool() {
  cpu::HugeBuffer old;
  std::lock_guard<std::mutex> lock(g_spare_mu);
  old = std::move(g_spare);
}

KvCache::~KvCache() {
  if (pool_.size() == 0) return;
  cpu::HugeBuffer old;  // an older spare, freed outside the lock
  std::lock_guard<std::mutex> lock(g_spare_mu);
  old = std::move(g_spare);
  g_spare = std::move(pool_);
}

int64_t KvCache::bytes_per_block(const KvSpec& s, int block_size) {
  return 2 * int64_t(s.n_layer) * block_size * s.n_kv_head * s.head_dim * dtype_size(s.dtype);
}

int KvCache::blocks_for_bytes(const KvSpec& s, int block_size, int64_t bytes) {
  return static_cast<int>(std::min<int64_t>(bytes / bytes_per_block(s, block_size), 1 << 30));
}

KvCache::KvCache(const KvSpec& spec, int block_size, int num_blocks, Backend* backend) {
  LOOM_CHECK(spec.dtype == DType::F32 || spec.dtype == DType::BF16,
             "the KV cache stores fp32 or bf16, not ", dtype_name(spec.dtype));
  LOOM_CHECK(block_size > 0 && num_blocks > 0, "KV cache of ", num_blocks, " blocks of ",
             block_size, " tokens");
  view_.spec = spec;
  view_.block_size = block_size;
  view_.num_blocks = num_blocks;
  const size_t layer_bytes =
      size_t(num_blocks) * block_size * spec.n_kv_head * spec.head_dim * dtype_size(spec.dtype);
  // One allocation on huge pages (decode attention reads a token's keys and values from blocks
  // anywhere in the pool): the spare pool if it has this size, else a new zero-filled one whose
  // pages are faulted in as blocks are first written.
  // On a device: one buffer of its backend, zero-filled so that no slot ever holds garbage a
  // kernel could turn into NaNs.
  uint8_t* base = nullptr;
  if (backend) {
    device_pool_ =
        BackendBuffer::zeroed(*backend, 2 * size_t(spec.n_layer) * layer_bytes, "kv_cache");
    base = device_pool_.as<uint8_t>();
  } else {
    pool_ = take_pool(2 * size_t(spec.n_layer) * layer_bytes);
    base = pool_.as<uint8_t>();
  }
  for (int l = 0; l < spec.n_layer; ++l) {
    view_.k.push_back(base + (2 * size_t(l)) * layer_bytes);
    view_.v.push_back(base + (2 * size_t(l) + 1) * layer_bytes);
  }
  ref_.assign(size_t(num_blocks), 0);
  hash_.assign(size_t(num_blocks), 0);
  cached_.assign(size_t(num_blocks), false);
  tokens_.resize(size_t(num_blocks));
  lru_pos_.resize(size_t(num_blocks));
  in_lru_.assign(size_t(num_blocks), false);
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // hand out 0, 1, ... first
}

int KvCache::num_available() const {
  return static_cast<int>(free_.size() + lru_.size());
}

void KvCache::forget(int32_t b) {
  if (!cached_[size_t(b)]) return;
  auto range = by_hash_.equal_range(hash_[size_t(b)]);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == b) {
      by_hash_.erase(it);
      break;
    }
  cached_[size_t(b)] = false;
  tokens_[size_t(b)].clear();
}

int32_t KvCache::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {  // evict the least recently released cached block
    b = lru_.front();
    lru_.pop_front();
    in_lru_[size_t(b)] = false;
    forget(b);
  } else {
    return -1;
  }
  ref_[size_t(b)] = 1;
  return b;
}

void KvCache::retain(int32_t b) {
  if (in_lru_[size_t(b)]) {
    lru_.erase(lru_pos_[size_t(b)]);
    in_lru_[size_t(b)] = false;
  }
  ++ref_[size_t(b)];
}

void KvCache::release(int32_t b) {
  LOOM_CHECK(ref_[size_t(b)] > 0, "KV block ", b, " released more often than taken");
  if (--ref_[size_t(b)] > 0) return;
  if (cached_[size_t(b)]) {  // keep its prefix findable until the memory is needed
    lru_.push_back(b);
    lru_pos_[size_t(b)] = std::prev(lru_.end());
    in_lru_[size_t(b)] = true;
  } else {
    free_.push_back(b);
  }
}

void KvCache::drop_cached() {
  for (int32_t b = 0; b < num_blocks(); ++b) forget(b);
  for (int32_t b : lru_) {
    in_lru_[size_t(b)] = false;
    free_.push_back(b);
  }
  lru_.clear();
}

uint64_t KvCache::block_hash(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < n; ++i) {  // splitmix64 over (hash, token)
    uint64_t z = h + 0x9e3779b97f4a7c15ull + uint64_t(uint32_t(tokens[i]));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h = z ^ (z >> 31);
  }
  return h;
}

int32_t KvCache::lookup(uint64_t hash, const int32_t* tokens) {
  auto range = by_hash_.equal_range(hash);
  for (auto it = range.first; it != range.second; ++it) {
    const int32_t b = it->second;
    if (std::equal(tokens, tokens + block_size(), tokens_[size_t(b)].begin())) {
      retain(b);
      return b;
    }
  }
  return -1;
}

void KvCache::publish(int32_t b, uint64_t hash, const int32_t* tokens) {
  if (cached_[size_t(b)]) return;
  auto range = by_hash_.equal_range(hash);
  for (auto it = range.first; it != range.second; ++it)
    if (std::equal(tokens, tokens + block_size(), tokens_[size_t(it->second)].begin()))
      return;  // an identical block is cached already
  cached_[size_t(b)] = true;
  hash_[size_t(b)] = hash;
  tokens_[size_t(b)].assign(tokens, tokens + block_size());
  by_hash_.emplace(hash, b);
}

}  // namespace loom::infer
