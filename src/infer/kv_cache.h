// The serving engine's paged KV cache: one pool of fixed-size blocks (block_size tokens of every
// layer's keys and values), handed to sequences one block at a time, with reference counts so
// that sequences sharing a prompt prefix share its blocks (prefix caching, as vLLM's automatic
// prefix caching: a full block is known by the hash of its tokens and of the blocks before it,
// and the tokens themselves are compared, so a hash collision cannot share wrong values).
// A block nobody references but that holds a cached prefix stays findable until its memory is
// needed: free blocks are handed out first, then those, least recently released first.
//
// The pool's memory outlives its cache: a destroyed cache leaves it as the process's one spare
// pool, and the next cache of the same byte size takes it instead of mapping a new one. A
// process that builds engines repeatedly (RL's held-out evaluation, benchmarks) then pays the
// page faults and zero-filling of the pages its blocks touch once, not at every engine: they
// were 4-7% of an RL run with evaluation. Old keys and values left in it are never read (a
// sequence reads only positions it wrote, and a new cache starts with no cached prefixes).
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "infer/engine_api.h"
#include "kernels/buffer.h"
#include "kernels/cpu/gemm_lowp_pages.h"

namespace loom::infer {

// What the pool stores (--kv-cache-dtype, vLLM's flag): auto is the model's compute type (fp32,
// or bf16 for a bf16 model); fp8 is E4M3 codes with a power-of-two scale per row of head_dim
// (kernels/cpu/kv_fp8.h), CPU only.
enum class KvCacheDtype { Auto, F32, BF16, FP8 };
KvCacheDtype kv_cache_dtype_from_name(const std::string& name);  // throws naming the choices
const char* kv_cache_dtype_name(KvCacheDtype d);                 // "auto", "fp32", ...
// The model's spec with the stored type `d` chose.
KvSpec kv_spec_with(KvSpec model, KvCacheDtype d);
// A stored type's --kv-cache-dtype name: "fp32", "bf16", "fp8".
const char* kv_stored_name(DType stored);

class KvCache {
 public:
  // backend: where the pool lives (ModelRunner::cache_backend; null: host memory, with the
  // spare pool). A device pool is one buffer of that backend, zero-filled, with no spare; an
  // fp8 one is refused (the device kernels read fp32 and bf16).
  KvCache(const KvSpec& spec, int block_size, int num_blocks, Backend* backend = nullptr);
  ~KvCache();  // leaves the pool as the spare (replacing an older spare)
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  // How many blocks a memory budget buys (keys and values of every layer, in spec.dtype, and an
  // fp8 pool's row scales).
  static int blocks_for_bytes(const KvSpec& spec, int block_size, int64_t bytes);
  static int64_t bytes_per_block(const KvSpec& spec, int block_size);

  const KvCacheView& view() const { return view_; }
  int block_size() const { return view_.block_size; }
  int num_blocks() const { return view_.num_blocks; }
  int num_available() const;  // free + cached-but-unreferenced
  int num_used() const { return num_blocks() - num_available(); }

  // A block for new tokens (reference count 1), or -1 when none is left.
  int32_t allocate();
  void retain(int32_t block);
  void release(int32_t block);
  int refcount(int32_t block) const { return ref_[size_t(block)]; }

  // Prefix caching. The hash of a full block given the hash of the blocks before it (0 for the
  // first) and its tokens.
  static uint64_t block_hash(uint64_t parent, const int32_t* tokens, int n);
  // A cached block with this hash and these tokens (its reference taken), or -1.
  int32_t lookup(uint64_t hash, const int32_t* tokens);
  // Marks a full block as holding these tokens under this hash (first publisher wins).
  void publish(int32_t block, uint64_t hash, const int32_t* tokens);
  // Forgets every cached prefix (the weights changed: cached keys and values are stale).
  void drop_cached();

  // Bytes of the spare pool the next cache of that size will take (0: none).
  static size_t spare_pool_bytes();
  // Frees the spare pool (a process done with engines, or one that needs the memory back).
  static void release_spare_pool();

 private:
  void forget(int32_t block);  // drops a block's cache entry (before reuse)
  cpu::HugeBuffer pool_;       // every layer's keys, then values (view_ points in)
  BackendBuffer device_pool_;  // instead, on a device backend
  KvCacheView view_;
  std::vector<int> ref_;
  std::vector<uint64_t> hash_;
  std::vector<bool> cached_;
  std::vector<std::vector<int32_t>> tokens_;  // of cached blocks
  std::unordered_multimap<uint64_t, int32_t> by_hash_;
  std::vector<int32_t> free_;  // never cached, or forgotten
  std::list<int32_t> lru_;     // cached, unreferenced, oldest first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<bool> in_lru_;
};

}  // namespace loom::infer
