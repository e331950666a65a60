// Host-side launch planning for the CUDA kernels: grid sizes, attention tile shapes and
// schedules, reduction chunking, multi-tensor chunk tables. Plain C++ (no CUDA headers), so it
// is compiled by both the host compiler and nvcc, and tested without a GPU.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::cuda {

constexpr int kThreads = 256;        // default block size of the pointwise/row kernels
constexpr int kMaxGrid1d = 1 << 16;  // grid-stride loops cover the rest

// Blocks for n elements at `threads` per block and `per_thread` elements per thread, at least
// 1 and at most max_blocks (kernels loop grid-stride over the rest).
int grid_1d(int64_t n, int threads = kThreads, int per_thread = 1, int max_blocks = kMaxGrid1d);

// ---------------------------------------------------------------------------------- attention
// Attention tiles, per padded head dim DMAX (32, 64, 128, 256): each query row (forward, dQ) or
// key row (dK/dV) is owned by `group` threads, each holding DMAX / group dims (interleaved:
// thread g owns dims g, g + group, ...), so a block of 256 threads owns 256 / group rows. The
// other operand streams through shared memory `tile` rows at a time (two fp32 tiles of
// tile x DMAX floats: 32 KiB at most).
template <int DMAX>
struct AttnCfg {
  static_assert(DMAX == 32 || DMAX == 64 || DMAX == 128 || DMAX == 256, "unsupported DMAX");
  static constexpr int threads = 256;
  static constexpr int group = DMAX / 16 < 2 ? 2 : DMAX / 16;  // 16 dims per thread (32: 16)
  static constexpr int dims_per_thread = DMAX / group;
  static constexpr int rows = threads / group;  // query rows (fwd, dQ) or key rows (dK/dV)
  static constexpr int tile = 4096 / DMAX < 64 ? 4096 / DMAX : 64;  // streamed rows per tile
};

struct AttnTileConfig {
  int dmax = 0, group = 0, rows = 0, tile = 0, threads = 0;
};
// The configuration for head dim D (the smallest DMAX >= D); throws for D outside [1, 256].
AttnTileConfig attn_tile_config(int D);

// Work items of the attention kernels: blockIdx.x indexes a list of (sequence, tile) pairs.
// Query tiles (forward and dQ) are listed most expensive first (causal: the last tiles of the
// longest sequences attend to the most keys), key tiles (dK/dV) likewise (the first tiles).
struct AttnSchedule {
  std::vector<int32_t> q_items;  // pairs (seq, tile of `rows` query rows)
  std::vector<int32_t> k_items;  // pairs (seq, tile of `rows` key rows)
  int max_len = 0;
  int64_t tokens = 0;  // cu[nseq] - cu[0]
  int num_q_items() const { return static_cast<int>(q_items.size() / 2); }
  int num_k_items() const { return static_cast<int>(k_items.size() / 2); }
};
AttnSchedule plan_attention(const int32_t* cu_seqlens, int nseq, int rows_per_tile);

// Query-key tile pairs a causal schedule visits (work estimate for benchmarks and tests).
int64_t causal_tile_pairs(const int32_t* cu_seqlens, int nseq, int rows_per_tile);

// ---------------------------------------------------------------------------------- reductions
// Column reductions over N rows (parameter gradients of norms and bias): the rows are cut
// into a number of chunks that depends only on N (deterministic for any device), each
// reduced by one block column into its own partial row, then added in chunk order.
int colred_chunks(int N);
// Blocks of the deterministic sum-of-squares / finite reductions over n elements (a function
// of n only, so the bits do not depend on the device).
int sumsq_blocks(int64_t n);

// ---------------------------------------------------------------------------------- multi-tensor
// One launch over many tensors: each block takes one chunk of at most `chunk` elements.
struct MtChunk {
  int32_t tensor;
  int32_t unused;
  int64_t offset;
  int64_t len;
};
std::vector<MtChunk> multi_tensor_chunks(const std::vector<int64_t>& sizes, int64_t chunk);

}  // namespace loom::cuda
