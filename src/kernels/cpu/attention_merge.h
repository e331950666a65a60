// Pieces of context-parallel (ring) attention that do not depend on the communicator:
//   - merging two partial attention results of the same queries over disjoint key sets,
//     exactly, by their log-sum-exps (the online softmax, one block at a time), and its
//     backward;
//   - the causal load-balancing layout: a sequence split into 2*CP chunks, rank i holding
//     chunks i and 2*CP-1-i (each document of a packed batch split that way), so every rank
//     does the same amount of causal attention work.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::cpu {

// out[N, H*D], lse[N, H] (natural log, as attention_forward writes it). A row with no keys has
// lse = -inf and out = 0; merging it with anything returns the other side. out/lse may alias
// out_a/lse_a (accumulate in place, the ring attention loop).
void attention_merge(float* out, float* lse, const float* out_a, const float* lse_a,
                     const float* out_b, const float* lse_b, int N, int H, int D);

// Backward of the merge. With w_x = exp(lse_x - lse): dout_x = w_x * dout and
// dlse_x = w_x * (<dout, out_x - out> + dlse). dlse nullable (0). out/lse are the merged result.
void attention_merge_backward(float* dout_a, float* dlse_a, float* dout_b, float* dlse_b,
                              const float* dout, const float* dlse, const float* out,
                              const float* lse, const float* out_a, const float* lse_a,
                              const float* out_b, const float* lse_b, int N, int H, int D);

// One contiguous run of a rank's local rows: `len` tokens of document `doc`, at local row
// `local_begin`, global row `global_begin`, document position `doc_pos` (of its first token).
struct CpPiece {
  int doc;
  int32_t local_begin, global_begin, doc_pos, len;
};

// A rank's share of a (packed) batch under causal load balancing. Each document of length L is
// cut into 2*cp chunks of L/(2cp); rank r holds chunk r then chunk 2cp-1-r of every document,
// documents in order. Both pieces of a document sit next to each other locally, and every
// position of the first precedes every position of the second, so plain causal attention over
// the local rows with local_cu_seqlens is exactly this rank's own (diagonal) ring block.
struct CpShard {
  int cp = 1, rank = 0;
  std::vector<int32_t> global_rows;       // [local rows] global row of each local row
  std::vector<int32_t> positions;         // [local rows] position within its document
  std::vector<int32_t> local_cu_seqlens;  // [ndoc+1] the local rows of each document
  std::vector<CpPiece> pieces;            // 2 per document
  int rows() const { return static_cast<int>(global_rows.size()); }
};

// Throws loom::Error naming the document and length when a document's length is not divisible
// by 2*cp (and what lengths would work), or when rank is outside [0, cp).
CpShard cp_shard(const int32_t* cu_seqlens, int nseq, int cp, int rank);

// local[i, :] = global[global_rows[i], :] and its inverse (C floats per row).
void cp_gather_rows(float* local, const float* global, const CpShard& shard, int C);
void cp_scatter_rows(float* global, const float* local, const CpShard& shard, int C);

// Which keys of piece k a query piece q sees under the causal document mask: none, all, or the
// causal triangle (the same chunk).
enum class BlockMask { None, Full, Causal };
BlockMask cp_block_mask(const CpPiece& q, const CpPiece& k);

}  // namespace loom::cpu
