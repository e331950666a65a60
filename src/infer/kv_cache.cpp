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

KvCacheDtype kv_cache_dtype_from_name(const std::string& name) {
  if (name == "auto") return KvCacheDtype::Auto;
  if (name == "fp32") return KvCacheDtype::F32;
  if (name == "bf16") return KvCacheDtype::BF16;
  if (name == "fp8") return KvCacheDtype::FP8;
  fail("unknown KV cache dtype '", name, "' (auto, fp32, bf16 or fp8)");
}

const char* kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::Auto:
      return "auto";
    case KvCacheDtype::F32:
      return "fp32";
    case KvCacheDtype::BF16:
      return "bf16";
    case KvCacheDtype::FP8:
      return "fp8";
  }
  return "?";
}

KvSpec kv_spec_with(KvSpec s, KvCacheDtype d) {
  if (d == KvCacheDtype::F32) s.dtype = DType::F32;
  if (d == KvCacheDtype::BF16) s.dtype = DType::BF16;
  if (d == KvCacheDtype::FP8) s.dtype = DType::F8E4M3;
  return s;
}

const char* kv_stored_name(DType t) {
  return t == DType::F8E4M3 ? "fp8" : t == DType::BF16 ? "bf16" : "fp32";
}

namespace {

// Bytes of one layer's keys (or values) per slot: every head's row, and an fp8 row's scale byte.
int64_t slot_bytes(const KvSpec& s) {
  return int64_t(s.n_kv_head) *
         (s.head_dim * int64_t(dtype_size(s.dtype)) + (s.dtype == DType::F8E4M3 ? 1 : 0));
}

}  // namespace

int64_t KvCache::bytes_per_block(const KvSpec& s, int block_size) {
  return 2 * int64_t(s.n_layer) * block_size * slot_bytes(s);
}

int KvCache::blocks_for_bytes(const KvSpec& s, int block_size, int64_t bytes) {
  return static_cast<int>(std::min<int64_t>(bytes / bytes_per_block(s, block_size), 1 << 30));
}

KvCache::KvCache(const KvSpec& spec, int block_size, int num_blocks, Backend* backend) {
  LOOM_CHECK(spec.dtype == DType::F32 || spec.dtype == DType::BF16 || spec.dtype == DType::F8E4M3,
             "the KV cache stores fp32, bf16 or fp8, not ", dtype_name(spec.dtype));
  const bool fp8 = spec.dtype == DType::F8E4M3;
  LOOM_CHECK(!fp8 || !backend,
             "--kv-cache-dtype fp8 is a CPU cache (its kernels are CPU ones); on a device use "
             "fp32 or bf16");
  LOOM_CHECK(block_size > 0 && num_blocks > 0, "KV cache of ", num_blocks, " blocks of ",
             block_size, " tokens");
  view_.spec = spec;
  view_.block_size = block_size;
  view_.num_blocks = num_blocks;
  // Per layer: the keys' elements, the values', then (fp8) the keys' and the values' row scales.
  const size_t slots = size_t(num_blocks) * block_size;
  const size_t elem_bytes = slots * spec.n_kv_head * spec.head_dim * dtype_size(spec.dtype);
  const size_t scale_bytes = fp8 ? slots * spec.n_kv_head : 0;
  const size_t layer_bytes = 2 * (elem_bytes + scale_bytes);
  // One allocation on huge pages (decode attention reads a token's keys and values from blocks
  // anywhere in the pool): the spare pool if it has this size, else a new zero-filled one whose
  // pages are faulted in as blocks are first written.
  // On a device: one buffer of its backend, zero-filled so that no slot ever holds garbage a
  // kernel could turn into NaNs.
  uint8_t* base = nullptr;
  if (backend) {
    device_pool_ = BackendBuffer::zeroed(*backend, size_t(spec.n_layer) * layer_bytes, "kv_cache");
    base = device_pool_.as<uint8_t>();
  } else {
    pool_ = take_pool(size_t(spec.n_layer) * layer_bytes);
    base = pool_.as<uint8_t>();
  }
  for (int l = 0; l < spec.n_layer; ++l) {
    uint8_t* layer = base + size_t(l) * layer_bytes;
    view_.k.push_back(layer);
    view_.v.push_back(layer + elem_bytes);
    if (fp8) {
      view_.k_scale.push_back(layer + 2 * elem_bytes);
      view_.v_scale.push_back(layer + 2 * elem_bytes + scale_bytes);
    }
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
