// The serving engine's paged KV cache as the Backend's paged ops see it (Backend::paged_kv_write,
// Backend::paged_attention; semantics of kernels/cpu/paged_attention.h): one layer's key and
// value pools in the backend's memory, and a batch's chunks described by one int32 buffer of the
// backend (uploaded once per engine step and read by every layer), so that a device needs no
// host pointer and no host round trip inside a forward.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace loom {

// One layer's pools, [num_blocks, block_size, n_kv_head, head_dim] elements of `dtype` (fp32,
// bf16, or F8E4M3 codes) each: buffers of the backend the ops run on. An fp8 pool has a scale
// byte per row too (kernels/cpu/kv_fp8.h), [num_blocks, block_size, n_kv_head] of them in
// k_scale / v_scale (null otherwise).
struct PagedKvBuffers {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F32;
  int num_blocks = 0, block_size = 16, n_kv_head = 0, head_dim = 0;
  uint8_t* k_scale = nullptr;
  uint8_t* v_scale = nullptr;
};

// The chunk table: per chunk kPagedChunkInts int32 fields, then every chunk's block table. A
// chunk's rows follow the previous chunk's in q, the new keys and values, and out.
enum PagedChunkField : int {
  kPagedRow0 = 0,    // its first row
  kPagedN = 1,       // new tokens (rows)
  kPagedStart = 2,   // position of its first new token
  kPagedTable = 3,   // where its block table starts, in int32s from the table's start
  kPagedBlocks = 4,  // entries of its block table (cover start + n positions)
};
constexpr int kPagedChunkInts = 5;

// Builds the table on the host (then uploaded with Backend::copy_h2d). Appends one chunk; the
// block table's first `num_blocks` entries are copied.
class PagedChunkTable {
 public:
  void clear(int nchunks) {
    ints_.assign(size_t(nchunks) * kPagedChunkInts, 0);
    added_ = 0;
    rows_ = 0;
  }
  void add(int n, int start_pos, const int32_t* block_table, int num_blocks) {
    int32_t* f = ints_.data() + size_t(added_++) * kPagedChunkInts;
    f[kPagedRow0] = rows_;
    f[kPagedN] = n;
    f[kPagedStart] = start_pos;
    f[kPagedTable] = static_cast<int32_t>(ints_.size());
    f[kPagedBlocks] = num_blocks;
    ints_.insert(ints_.end(), block_table, block_table + num_blocks);  // may reallocate: f dead
    rows_ += n;
  }
  const std::vector<int32_t>& ints() const { return ints_; }
  int rows() const { return rows_; }
  int chunks() const { return added_; }

 private:
  std::vector<int32_t> ints_;
  int added_ = 0, rows_ = 0;
};

}  // namespace loom
