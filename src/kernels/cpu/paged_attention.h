// Attention over a paged KV cache (vLLM's layout), for serving: the keys and values of a
// sequence's earlier tokens live in fixed-size blocks of a pool, found through its block table;
// queries of new tokens (a prefill chunk, or one decode token) attend causally to every
// position up to their own. Query length != key length, GQA (Hq % Hkv == 0).
//
// Pool layout, per layer: [num_blocks, block_size, Hkv, D] elements of fp32 or bf16 (bf16
// halves the cache; values are rounded to nearest even when written, fp32 arithmetic after).
// Position p of a sequence is slot p % block_size of block block_table[p / block_size].
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace loom::cpu {

struct PagedKv {
  void* k = nullptr;  // [num_blocks, block_size, Hkv, D]
  void* v = nullptr;
  DType dtype = DType::F32;  // F32 or BF16
  int block_size = 16, Hkv = 0, D = 0;
};

// Writes the keys and values of n tokens at positions start .. start + n - 1 (rows of k and v
// are `ld` floats apart, e.g. inside fused QKV rows).
void paged_kv_write(const PagedKv& cache, const int32_t* block_table, int start, int n,
                    const float* k, const float* v, int ld);

// out[i, h*D:(h+1)*D] = softmax(q_i . K[0 .. start+i] * scale) V for query rows i < n (rows of q
// `ldq` floats apart, of Hq heads; out rows Hq * D contiguous). Each (row, head) is one work
// item summing in position order: the bits do not depend on the thread count.
void paged_attention_forward(float* out, const float* q, int ldq, int n, int start, int Hq,
                             float scale, const PagedKv& cache, const int32_t* block_table);

}  // namespace loom::cpu
