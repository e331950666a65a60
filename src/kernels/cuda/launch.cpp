#include "kernels/cuda/launch.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace loom::cuda {

int grid_1d(int64_t n, int threads, int per_thread, int max_blocks) {
  LOOM_CHECK(threads > 0 && per_thread > 0 && max_blocks > 0, "grid_1d: bad arguments");
  const int64_t per_block = int64_t{threads} * per_thread;
  const int64_t blocks = (std::max<int64_t>(n, 1) + per_block - 1) / per_block;
  return static_cast<int>(std::min<int64_t>(blocks, max_blocks));
}

namespace {
template <int DMAX>
AttnTileConfig cfg_of() {
  using C = AttnCfg<DMAX>;
  return {DMAX, C::group, C::rows, C::tile, C::threads};
}
}  // namespace

AttnTileConfig attn_tile_config(int D) {
  LOOM_CHECK(D >= 1 && D <= 256, "attention (cuda): head dim D=", D,
             " is outside the supported range [1, 256]");
  if (D <= 32) return cfg_of<32>();
  if (D <= 64) return cfg_of<64>();
  if (D <= 128) return cfg_of<128>();
  return cfg_of<256>();
}

AttnSchedule plan_attention(const int32_t* cu, int nseq, int rows) {
  LOOM_CHECK(rows > 0, "plan_attention: rows per tile must be positive");
  AttnSchedule s;
  if (nseq <= 0) return s;
  s.tokens = cu[nseq] - cu[0];
  // Sequences with tokens, longest first; ties keep sequence order (stable).
  std::vector<int> order;
  for (int q = 0; q < nseq; ++q)
    if (cu[q + 1] > cu[q]) order.push_back(q);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return cu[a + 1] - cu[a] > cu[b + 1] - cu[b]; });
  // Items sorted by cost: a query tile t of a causal sequence sees t + 1 key tiles; a key tile
  // t of a sequence with nb tiles is seen by nb - t query tiles.
  struct Item {
    int seq, tile, cost;
  };
  std::vector<Item> q, k;
  for (int seq : order) {
    const int len = cu[seq + 1] - cu[seq];
    s.max_len = std::max(s.max_len, len);
    const int nb = (len + rows - 1) / rows;
    for (int t = 0; t < nb; ++t) {
      q.push_back({seq, t, t + 1});
      k.push_back({seq, t, nb - t});
    }
  }
  auto by_cost = [](const Item& a, const Item& b) { return a.cost > b.cost; };
  std::stable_sort(q.begin(), q.end(), by_cost);
  std::stable_sort(k.begin(), k.end(), by_cost);
  for (const Item& it : q) s.q_items.insert(s.q_items.end(), {it.seq, it.tile});
  for (const Item& it : k) s.k_items.insert(s.k_items.end(), {it.seq, it.tile});
  return s;
}

int64_t causal_tile_pairs(const int32_t* cu, int nseq, int rows) {
  int64_t pairs = 0;
  for (int q = 0; q < nseq; ++q) {
    const int64_t nb = (cu[q + 1] - cu[q] + rows - 1) / rows;
    pairs += nb * (nb + 1) / 2;
  }
  return pairs;
}

int colred_chunks(int N) {
  constexpr int kRowsPerChunk = 64, kMaxChunks = 128;
  return std::clamp((N + kRowsPerChunk - 1) / kRowsPerChunk, 1, kMaxChunks);
}

int sumsq_blocks(int64_t n) {
  constexpr int64_t kPerBlock = int64_t{kThreads} * 16;
  constexpr int64_t kMaxBlocks = 1024;
  return static_cast<int>(std::clamp<int64_t>((n + kPerBlock - 1) / kPerBlock, 1, kMaxBlocks));
}

std::vector<MtChunk> multi_tensor_chunks(const std::vector<int64_t>& sizes, int64_t chunk) {
  LOOM_CHECK(chunk > 0, "multi_tensor_chunks: chunk must be positive");
  std::vector<MtChunk> out;
  for (size_t t = 0; t < sizes.size(); ++t) {
    LOOM_CHECK(sizes[t] >= 0, "multi_tensor_chunks: tensor ", t, " has negative size");
    for (int64_t off = 0; off < sizes[t]; off += chunk)
      out.push_back({static_cast<int32_t>(t), 0, off, std::min(chunk, sizes[t] - off)});
  }
  return out;
}

}  // namespace loom::cuda
