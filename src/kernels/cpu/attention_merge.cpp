// Exact merge of partial attention results, and the context-parallel chunk layout.
#include "kernels/cpu/attention_merge.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/parallel.h"

namespace loom::cpu {

namespace {

// The two weights exp(lse_x - lse) of a merge, and the merged lse; -inf when both are empty.
struct Weights {
  float wa, wb, lse;
};

inline Weights merge_weights(float la, float lb) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (la == kNegInf && lb == kNegInf) return {0.0f, 0.0f, kNegInf};
  const float m = std::max(la, lb);
  // exp(-inf) = 0 handles one empty side.
  const double ea = std::exp(static_cast<double>(la) - m);
  const double eb = std::exp(static_cast<double>(lb) - m);
  const double sum = ea + eb;
  return {static_cast<float>(ea / sum), static_cast<float>(eb / sum),
          static_cast<float>(m + std::log(sum))};
}

}  // namespace

void attention_merge(float* out, float* lse, const float* out_a, const float* lse_a,
                     const float* out_b, const float* lse_b, int N, int H, int D) {
  const int64_t rows = static_cast<int64_t>(N) * H;
#pragma omp parallel for schedule(static) if (worth_parallel(rows, D))
  for (int64_t i = 0; i < rows; ++i) {
    const Weights w = merge_weights(lse_a[i], lse_b[i]);
    const float* a = out_a + i * D;
    const float* b = out_b + i * D;
    float* o = out + i * D;
#pragma omp simd
    for (int d = 0; d < D; ++d) o[d] = w.wa * a[d] + w.wb * b[d];
    lse[i] = w.lse;
  }
}

void attention_merge_backward(float* dout_a, float* dlse_a, float* dout_b, float* dlse_b,
                              const float* dout, const float* dlse, const float* out,
                              const float* lse, const float* out_a, const float* lse_a,
                              const float* out_b, const float* lse_b, int N, int H, int D) {
  const int64_t rows = static_cast<int64_t>(N) * H;
#pragma omp parallel for schedule(static) if (worth_parallel(rows, D))
  for (int64_t i = 0; i < rows; ++i) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const bool empty = lse[i] == kNegInf;
    const float wa = empty ? 0.0f : std::exp(lse_a[i] - lse[i]);
    const float wb = empty ? 0.0f : std::exp(lse_b[i] - lse[i]);
    const float* g = dout + i * D;
    const float* o = out + i * D;
    const float* a = out_a + i * D;
    const float* b = out_b + i * D;
    double dot_a = 0.0, dot_b = 0.0;
    for (int d = 0; d < D; ++d) {
      dot_a += static_cast<double>(g[d]) * (a[d] - o[d]);
      dot_b += static_cast<double>(g[d]) * (b[d] - o[d]);
      dout_a[i * D + d] = wa * g[d];
      dout_b[i * D + d] = wb * g[d];
    }
    const double dl = dlse ? dlse[i] : 0.0;
    dlse_a[i] = static_cast<float>(wa * (dot_a + dl));
    dlse_b[i] = static_cast<float>(wb * (dot_b + dl));
  }
}

CpShard cp_shard(const int32_t* cu_seqlens, int nseq, int cp, int rank) {
  LOOM_CHECK(cp >= 1, "context-parallel size cp=", cp, " must be at least 1");
  LOOM_CHECK(rank >= 0 && rank < cp, "context-parallel rank ", rank, " is outside [0, ", cp, ")");
  CpShard s;
  s.cp = cp;
  s.rank = rank;
  s.local_cu_seqlens.push_back(0);
  const int parts = 2 * cp;
  for (int d = 0; d < nseq; ++d) {
    const int32_t begin = cu_seqlens[d], len = cu_seqlens[d + 1] - cu_seqlens[d];
    LOOM_CHECK(len >= 0, "cu_seqlens decreases at sequence ", d);
    LOOM_CHECK(len % parts == 0, "sequence ", d, " has ", len,
               " tokens, not divisible by 2*cp = ", parts, " (cp=", cp,
               "); context parallelism needs every sequence length to be a multiple of ", parts,
               " (e.g. ", (len / parts + 1) * parts, ")");
    const int32_t chunk = len / parts;
    for (int c : {rank, parts - 1 - rank}) {
      CpPiece p{d, s.rows(), begin + c * chunk, c * chunk, chunk};
      s.pieces.push_back(p);
      for (int32_t i = 0; i < chunk; ++i) {
        s.global_rows.push_back(p.global_begin + i);
        s.positions.push_back(p.doc_pos + i);
      }
    }
    s.local_cu_seqlens.push_back(s.rows());
  }
  return s;
}

void cp_gather_rows(float* local, const float* global, const CpShard& shard, int C) {
  for (int i = 0; i < shard.rows(); ++i)
    std::memcpy(local + static_cast<int64_t>(i) * C,
                global + static_cast<int64_t>(shard.global_rows[i]) * C, sizeof(float) * C);
}

void cp_scatter_rows(float* global, const float* local, const CpShard& shard, int C) {
  for (int i = 0; i < shard.rows(); ++i)
    std::memcpy(global + static_cast<int64_t>(shard.global_rows[i]) * C,
                local + static_cast<int64_t>(i) * C, sizeof(float) * C);
}

BlockMask cp_block_mask(const CpPiece& q, const CpPiece& k) {
  if (q.doc != k.doc) return BlockMask::None;
  if (q.doc_pos == k.doc_pos) return BlockMask::Causal;
  return k.doc_pos < q.doc_pos ? BlockMask::Full : BlockMask::None;
}

}  // namespace loom::cpu
