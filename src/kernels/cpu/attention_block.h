// Full (unmasked) attention of a block of queries against a block of keys: the off-diagonal
// blocks of ring (context-parallel) attention, where every key of the block precedes every
// query (or belongs to another document and is skipped by the caller). The diagonal blocks are
// plain causal attention (cpu_ops.h attention_forward).
//
// Layout: query row i, head h at q[i*ldq + h*D]; key/value row j, kv head hk at
// k[j*ldk + hk*D], v[j*ldk + hk*D] (grouped-query attention: Hq/Hkv query heads per kv head);
// out [nq, Hq*D] and lse [nq, Hq] (natural log) packed.
#pragma once

#include <cstdint>

namespace loom::cpu {

// Writes out and lse for every query row. nk == 0: out = 0 and lse = -inf (no keys).
void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k,
                             const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                             float scale);

// Backward of this block's contribution to the attention whose FINAL (merged over every block)
// output and log-sum-exp are `out` and `lse`: P = exp(scale*q.k - lse), dS = P*(dO.v - delta)
// with delta = rowsum(dO*out). Adds into dq (row stride ldq), dk and dv (row stride ldk); each
// element is summed by one thread in a fixed order (deterministic for any thread count).
void attention_block_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, int ldq, const float* k,
                              const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                              float scale);

}  // namespace loom::cpu
