// The decode case of cpu::paged_attention (one new token of a sequence), over a range of kv
// heads: an internal piece of paged_attention.cpp, in its own file because it is the one loop
// single-stream serving spends its attention time in.
#pragma once

#include "kernels/cpu/paged_attention.h"

namespace loom::cpu {

// Whether paged_decode_heads handles this head dimension (AVX-512 builds, D a multiple of 16 up
// to 128); otherwise the caller's general path runs the decode.
bool paged_decode_supported(int head_dim);

// out (Hq * D floats of the token) for query heads of kv heads [h0, h1): attention of q (the
// token's Hq * D query floats) over positions [0, ch.start_pos] of the cache (ch.n == 1, the new
// key and value written already). Each query head's result depends only on its own rows, read in
// a fixed order: not on the range or the thread that runs it.
void paged_decode_heads(float* out, const float* q, const PagedKvLayer& c, const PagedChunk& ch,
                        int h0, int h1, int group, float scale);

}  // namespace loom::cpu
