// The decode case of cpu::paged_attention (one new token of a sequence), over a range of kv
// heads: an internal piece of paged_attention.cpp, in its own file because it is the one loop
// single-stream serving spends its attention time in.
#pragma once

#include "kernels/cpu/paged_attention.h"

namespace loom::cpu {

// Whether paged_decode_heads handles this head dimension (AVX-512 builds, D a multiple of 16 up
// to 128); otherwise the caller's general path runs the decode.
bool paged_decode_supported(int head_dim);

// A decode's context is split into this many position segments (whole blocks, at most
// kDecodeSegments; 1 below two blocks), each read by its own work item and merged afterwards:
// a single stream then spreads over threads by positions, each reading whole contiguous blocks.
// The split depends on the context length alone (not on the threads or the batch), so the bits
// do not either.
constexpr int kDecodeSegments = 2;
inline int paged_decode_segments(int L, int block_size) {
  const int nblocks = (L + block_size - 1) / block_size;
  return nblocks < 2 ? 1 : kDecodeSegments;
}

// Segment `seg` of `nseg` (paged_decode_segments) of the attention of q (the token's Hq * D
// query floats) over positions [0, ch.start_pos] of the cache (ch.n == 1, the new key and value
// written already), for the query heads of kv heads [h0, h1). With one segment, writes the
// result to out (Hq * D floats of the token); otherwise, per query head hq of the range,
// partial[hq * (D + 2) + ...] = the segment's maximum score, its sum of exponentials and its D
// weighted sums of values (unnormalised). Each query head's result depends only on its own
// rows, read in a fixed order: not on the range or the thread that runs it.
void paged_decode_heads(float* out, float* partial, const float* q, const PagedKvLayer& c,
                        const PagedChunk& ch, int h0, int h1, int group, float scale, int seg,
                        int nseg);

}  // namespace loom::cpu
