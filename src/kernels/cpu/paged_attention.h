// Attention over a paged KV cache, for serving: a batch of sequence chunks whose new tokens'
// queries attend causally to every earlier position of their sequence, with keys and values
// scattered over fixed-size blocks of one pool (the block table maps position p to block
// table[p / block_size], slot p % block_size). Storage fp32, bf16 or fp8 (E4M3 codes with a
// power-of-two scale per row, kv_fp8.h); grouped-query heads.
//
// Pool layout (one layer): [num_blocks, block_size, n_kv_head, head_dim] elements, the layout
// of infer::KvCacheView; fp8 scales [num_blocks, block_size, n_kv_head] bytes.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace loom::cpu {

struct PagedKvLayer {
  void* k = nullptr;  // element type `dtype`
  void* v = nullptr;
  DType dtype = DType::F32;  // F32, BF16 or F8E4M3
  int num_blocks = 0, block_size = 16, n_kv_head = 0, head_dim = 0;
  uint8_t* k_scale = nullptr;  // F8E4M3: each row's scale byte (kv_fp8.h)
  uint8_t* v_scale = nullptr;
};

// One sequence's chunk: `n` new tokens at positions start_pos .. start_pos + n - 1; their rows
// follow the previous chunk's rows in q, k_new, v_new and out.
struct PagedChunk {
  int n = 0;
  int start_pos = 0;
  const int32_t* block_table = nullptr;
  int num_blocks = 0;  // entries in block_table; must cover start_pos + n positions
};

// Stores the chunks' new keys and values (rows of n_kv_head * head_dim floats, `ld` apart;
// rounded to bf16 for a bf16 pool, encoded head by head with kv_fp8_encode_row for an fp8 one)
// into their slots.
void paged_kv_write(const PagedKvLayer& cache, const float* k_new, const float* v_new, int ld,
                    const PagedChunk* chunks, int nchunks);

// out[rows, Hq * D] = causal attention of q (rows `ldq` apart, Hq heads of D) over positions
// [0, start_pos + i] of each chunk's sequence, read from the cache (written first with
// paged_kv_write), reading the stored type (no widened copy of the cache). Online softmax in fp32;
// parallel over chunks x ranges of kv heads x query tiles (a decode: x position segments,
// paged_decode.h), each range read a block at a time in memory order; the bits do not depend on the
// threads.
void paged_attention(float* out, const float* q, int ldq, const PagedKvLayer& cache,
                     const PagedChunk* chunks, int nchunks, int Hq, float scale);

// The same with a sliding window (window > 0: each query sees its last `window` positions, its
// own included) and soft-capped scores (softcap > 0: softcap * tanh(score / softcap)), one
// (row, head) at a time (Gemma 2 and 3).
void paged_attention_variant(float* out, const float* q, int ldq, const PagedKvLayer& cache,
                             const PagedChunk* chunks, int nchunks, int Hq, float scale, int window,
                             float softcap);

}  // namespace loom::cpu
