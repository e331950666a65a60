// Context parallelism: ring attention over a CP group. Each rank holds its share of every
// sequence under causal load balancing (kernels/cpu/attention_merge.h cp_shard: chunks r and
// 2cp-1-r of each document). The forward computes the rank's own (diagonal) block with the
// causal kernel, then passes the keys/values around the ring: while it computes against the
// block it holds, the next block is already in flight (send to rank+1, receive from rank-1),
// and each block's partial result is merged into the output by its log-sum-exp. The diagonal
// block is computed piece by piece (each chunk causally with itself, the document's earlier
// chunk in full), and the work is cut into slices between which the transfers in flight are
// polled, since MPI moves a large message only inside MPI calls. The backward
// runs the same ring: every block's dK/dV contribution travels with an accumulator that ends
// at the block's owner; the receive of the accumulator overlaps the local computation.
//
// Every buffer is a backend buffer and every computation a Backend op (the block kernels, the
// merge, copies and adds), and the communicator moves backend memory, so the ring runs on the
// device; the shards (CpBatch) are host metadata, like the attention's cu_seqlens.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/cpu/attention_merge.h"
#include "model/parallel_ops.h"

namespace loom {

struct ContextParallel {
  int size = 1, rank = 0;
  comm::Communicator* comm = nullptr;  // the context-parallel group (size > 1)
};

// All ranks' shards of one micro-batch (shards[r] = cp_shard(..., r)), computed from the global
// cu_seqlens; every rank of the CP group needs them all (it computes against every rank's keys).
struct CpBatch {
  std::vector<cpu::CpShard> shards;
  static CpBatch make(const int32_t* cu_seqlens, int nseq, int cp);
};

// The attention core of a context-parallel model (AttentionCore: the Decoder calls it as it
// calls packed attention; the micro-batch brings the shards, ModelInput::cp).
class RingAttention final : public AttentionCore {
 public:
  // Time spent per call (for the overlap measurement): computing, and waiting for blocks that
  // had not arrived when the computation needed them (the exposed communication).
  struct Stats {
    double compute_s = 0, wait_s = 0;
    int64_t bytes_sent = 0;
  };

  RingAttention(const ContextParallel& cp, Backend& backend) : cp_(cp), be_(backend) {}

  // q, k, v in one fused [rows, ld] buffer (q at 0, k at Hq*D, v at (Hq+Hkv)*D) of this
  // rank's rows; out [rows, Hq*D], lse [rows, Hq].
  void forward(float* out, float* lse, const float* qkv, int ld, int Hq, int Hkv, int D,
               float scale, const CpBatch& batch);
  // dqkv [rows, ld] is written (q, k and v parts); out/lse are forward's results.
  void backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                const float* lse, int ld, int Hq, int Hkv, int D, float scale,
                const CpBatch& batch);

  // AttentionCore: the above over the micro-batch's shards (throws when it has none).
  void forward(float* out, float* lse, const float* qkv, int ld, int Hq, int Hkv, int D,
               float scale, const ModelInput& in) override;
  void backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                const float* lse, int ld, int Hq, int Hkv, int D, float scale,
                const ModelInput& in) override;
  // All-reduces the sums over the CP group.
  void sum_sequence_parts(double* sums, int nseq) override;

  // With overlap off, each block transfer is waited before the computation it would hide
  // behind (the baseline of the overlap measurement).
  void set_overlap(bool on) { overlap_ = on; }
  Stats& stats() { return stats_; }

 private:
  void pack_kv(const float* qkv, int ld, int Hq, int Hkv, int D, int rows);
  void poll();  // tests the transfers in flight (MPI progresses them only inside MPI calls)
  void full_block_forward(float* out, float* lse, const float* qkv, int ld, int q0, int nq,
                          const float* k, const float* v, int ldk, int nk, int Hq, int Hkv, int D,
                          float scale);
  void full_block_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                           const float* lse, int ld, int q0, int nq, const float* k, const float* v,
                           float* dk, float* dv, int ldk, int nk, int Hq, int Hkv, int D,
                           float scale);

  ContextParallel cp_;
  Backend& be_;
  bool overlap_ = true;
  Stats stats_;
  BackendBuffer kv_a_, kv_b_, part_out_, part_lse_, acc_in_, contrib_, acc_out_[2], home_;
  std::vector<comm::Work*> pending_;
};

}  // namespace loom
