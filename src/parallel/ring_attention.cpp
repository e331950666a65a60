#include "parallel/ring_attention.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "model/decoder.h"

namespace loom {

namespace {
// Message tags: forward blocks, backward blocks, backward dK/dV accumulators (+ ring step).
constexpr int kTagFwd = 1000, kTagBwd = 2000, kTagAcc = 3000;
// Query rows per block-kernel call: between calls the transfers in flight are polled (MPI moves
// a large message only inside MPI calls, so an unpolled transfer would wait for the next wait).
constexpr int kPollRows = 128;

bool usable(const cpu::CpPiece& q, const cpu::CpPiece& k, cpu::BlockMask want) {
  return q.len > 0 && k.len > 0 && cpu::cp_block_mask(q, k) == want;
}
}  // namespace

void RingAttention::poll() {
  for (comm::Work* w : pending_) w->test();
}

// The rank's keys and values as [rows, 2*Hkv*D] (k then v per row): the block sent around.
void RingAttention::pack_kv(const float* qkv, int ld, int Hq, int Hkv, int D, int rows) {
  const size_t W = size_t(Hkv) * D;
  float* kv = kv_a_.ensure_n<float>(be_, std::max<size_t>(1, rows * 2 * W), "ring_attention");
  be_.copy_2d(kv, 2 * W * sizeof(float), qkv + int64_t(Hq) * D, size_t(ld) * sizeof(float),
              2 * W * sizeof(float), size_t(rows));
}

// out/lse of query rows [q0, q0+nq) merged with their full attention to nk keys at k, v (row
// stride ldk), in slices of kPollRows queries with a poll between slices.
void RingAttention::full_block_forward(float* out, float* lse, const float* qkv, int ld, int q0,
                                       int nq, const float* k, const float* v, int ldk, int nk,
                                       int Hq, int Hkv, int D, float scale) {
  float* po = part_out_.ensure_n<float>(be_, size_t(kPollRows) * Hq * D, "ring_attention");
  float* pl = part_lse_.ensure_n<float>(be_, size_t(kPollRows) * Hq, "ring_attention");
  for (int i = 0; i < nq; i += kPollRows) {
    const int n = std::min(kPollRows, nq - i), r = q0 + i;
    be_.attention_block_forward(po, pl, qkv + int64_t(r) * ld, ld, k, v, ldk, n, nk, Hq, Hkv, D,
                                scale);
    float* o = out + int64_t(r) * Hq * D;
    float* l = lse + int64_t(r) * Hq;
    be_.attention_merge(o, l, o, l, po, pl, n, Hq, D);
    poll();
  }
}

void RingAttention::full_block_backward(float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* lse, int ld, int q0, int nq,
                                        const float* k, const float* v, float* dk, float* dv,
                                        int ldk, int nk, int Hq, int Hkv, int D, float scale) {
  for (int i = 0; i < nq; i += kPollRows) {
    const int n = std::min(kPollRows, nq - i), r = q0 + i;
    be_.attention_block_backward(dqkv + int64_t(r) * ld, dk, dv, dout + int64_t(r) * Hq * D,
                                 out + int64_t(r) * Hq * D, lse + int64_t(r) * Hq,
                                 qkv + int64_t(r) * ld, ld, k, v, ldk, n, nk, Hq, Hkv, D, scale);
    poll();
  }
}

void RingAttention::forward(float* out, float* lse, const float* qkv, int ld, int Hq, int Hkv,
                            int D, float scale, const CpBatch& batch) {
  const int cp = cp_.size, me = cp_.rank;
  const cpu::CpShard& mine = batch.shards[size_t(me)];
  const int rows = mine.rows(), W = Hkv * D, next = (me + 1) % cp, prev = (me + cp - 1) % cp;
  const float* k_loc = qkv + int64_t(Hq) * D;
  const float* v_loc = k_loc + W;
  pack_kv(qkv, ld, Hq, Hkv, D, rows);
  const int64_t n = int64_t(rows) * 2 * W;  // every rank holds the same number of rows
  float* cur = kv_a_.as<float>();
  float* nxt = kv_b_.ensure_n<float>(be_, std::max<int64_t>(n, 1), "ring_attention");
  for (int s = 0; s < cp; ++s) {
    comm::Work send, recv;
    pending_.clear();
    if (s + 1 < cp) {  // the next block travels while this one is computed
      send = cp_.comm->send_async(cur, n, DType::F32, next, kTagFwd + s);
      recv = cp_.comm->recv_async(nxt, n, DType::F32, prev, kTagFwd + s);
      stats_.bytes_sent += n * 4;
      pending_ = {&send, &recv};
      if (!overlap_) {
        const double t = now_seconds();
        send.wait();
        recv.wait();
        stats_.wait_s += now_seconds() - t;
      }
    }
    const double t0 = now_seconds();
    if (s == 0) {
      // The diagonal block, piece by piece: each piece causally with itself first (writes its
      // out and lse), then the pieces it sees whole (the document's earlier chunk) merged in.
      for (const cpu::CpPiece& qp : mine.pieces) {
        if (qp.len == 0) continue;
        const int32_t cu[2] = {qp.local_begin, qp.local_begin + qp.len};
        be_.attention_forward(out, lse, qkv, k_loc, v_loc, ld, cu, 1, Hq, Hkv, D, scale);
        poll();
      }
      for (const cpu::CpPiece& qp : mine.pieces)
        for (const cpu::CpPiece& kp : mine.pieces)
          if (usable(qp, kp, cpu::BlockMask::Full))
            full_block_forward(out, lse, qkv, ld, qp.local_begin, qp.len,
                               k_loc + int64_t(kp.local_begin) * ld,
                               v_loc + int64_t(kp.local_begin) * ld, ld, kp.len, Hq, Hkv, D, scale);
    } else {
      const cpu::CpShard& theirs = batch.shards[size_t((me - s + cp) % cp)];
      const float* kv = cur;
      for (const cpu::CpPiece& qp : mine.pieces)
        for (const cpu::CpPiece& kp : theirs.pieces) {
          // Other documents, or keys after the queries, are skipped; chunks never share ranks,
          // so there is no causal block here.
          if (!usable(qp, kp, cpu::BlockMask::Full)) continue;
          const float* kb = kv + int64_t(kp.local_begin) * 2 * W;
          full_block_forward(out, lse, qkv, ld, qp.local_begin, qp.len, kb, kb + W, 2 * W, kp.len,
                             Hq, Hkv, D, scale);
        }
    }
    stats_.compute_s += now_seconds() - t0;
    if (s + 1 < cp) {
      const double t = now_seconds();
      send.wait();
      recv.wait();
      stats_.wait_s += now_seconds() - t;
      std::swap(cur, nxt);
    }
  }
  pending_.clear();
}

void RingAttention::backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int ld, int Hq, int Hkv, int D, float scale,
                             const CpBatch& batch) {
  const int cp = cp_.size, me = cp_.rank;
  const cpu::CpShard& mine = batch.shards[size_t(me)];
  const int rows = mine.rows(), W = Hkv * D, next = (me + 1) % cp, prev = (me + cp - 1) % cp;
  const float* k_loc = qkv + int64_t(Hq) * D;
  const float* v_loc = k_loc + W;
  float* dk_loc = dqkv + int64_t(Hq) * D;
  float* dv_loc = dk_loc + W;
  pack_kv(qkv, ld, Hq, Hkv, D, rows);
  const int64_t n = int64_t(rows) * 2 * W;
  const size_t nb = size_t(std::max<int64_t>(n, 1));
  float* cur = kv_a_.as<float>();
  float* nxt = kv_b_.ensure_n<float>(be_, nb, "ring_attention");
  float* acc_in = acc_in_.ensure_n<float>(be_, nb, "ring_attention");
  float* contrib = contrib_.ensure_n<float>(be_, nb, "ring_attention");
  float* acc_outs[2] = {acc_out_[0].ensure_n<float>(be_, nb, "ring_attention"),
                        acc_out_[1].ensure_n<float>(be_, nb, "ring_attention")};
  comm::Work acc_sends[2];  // the accumulator sends in flight, one per acc_out_ buffer
  for (int s = 0; s < cp; ++s) {
    comm::Work send, recv, acc_recv;
    // The accumulated dK/dV of the block held at step s (s >= 2) comes from rank - 1, which
    // handled that block at step s - 1; received while this rank computes its contribution.
    // Posted before this step's block receive: rank - 1 sent it (end of step s - 1) before
    // that block (start of step s), and a communicator without tags (NCCL) matches each
    // pair's messages in the order they were issued.
    if (s >= 2) acc_recv = cp_.comm->recv_async(acc_in, n, DType::F32, prev, kTagAcc + s);
    if (s + 1 < cp) {
      send = cp_.comm->send_async(cur, n, DType::F32, next, kTagBwd + s);
      recv = cp_.comm->recv_async(nxt, n, DType::F32, prev, kTagBwd + s);
      stats_.bytes_sent += n * 4;
    }
    pending_ = {&send, &recv, &acc_recv, &acc_sends[0], &acc_sends[1]};
    if (!overlap_) {
      const double t = now_seconds();
      send.wait();
      recv.wait();
      acc_recv.wait();
      stats_.wait_s += now_seconds() - t;
    }
    const double t0 = now_seconds();
    if (s == 0) {
      // Own block: every piece causally with itself (writes its dq, dk, dv rows), then the
      // whole-visible pairs accumulate.
      for (const cpu::CpPiece& qp : mine.pieces) {
        if (qp.len == 0) continue;
        const int32_t cu[2] = {qp.local_begin, qp.local_begin + qp.len};
        be_.attention_backward(dqkv, dk_loc, dv_loc, dout, qkv, k_loc, v_loc, out, lse, ld, cu, 1,
                               Hq, Hkv, D, scale);
        poll();
      }
      for (const cpu::CpPiece& qp : mine.pieces)
        for (const cpu::CpPiece& kp : mine.pieces)
          if (usable(qp, kp, cpu::BlockMask::Full)) {
            const int64_t ko = int64_t(kp.local_begin) * ld;
            full_block_backward(dqkv, dout, qkv, out, lse, ld, qp.local_begin, qp.len, k_loc + ko,
                                v_loc + ko, dk_loc + ko, dv_loc + ko, ld, kp.len, Hq, Hkv, D,
                                scale);
          }
    } else {
      const cpu::CpShard& theirs = batch.shards[size_t((me - s + cp) % cp)];
      const float* kv = cur;
      be_.fill_bytes(contrib, 0, sizeof(float) * size_t(n));
      for (const cpu::CpPiece& qp : mine.pieces)
        for (const cpu::CpPiece& kp : theirs.pieces) {
          if (!usable(qp, kp, cpu::BlockMask::Full)) continue;
          const int64_t ko = int64_t(kp.local_begin) * 2 * W;
          full_block_backward(dqkv, dout, qkv, out, lse, ld, qp.local_begin, qp.len, kv + ko,
                              kv + ko + W, contrib + ko, contrib + ko + W, 2 * W, kp.len, Hq, Hkv,
                              D, scale);
        }
    }
    stats_.compute_s += now_seconds() - t0;
    const double t = now_seconds();
    if (s >= 1) {
      // This block's accumulator: the contributions of the ranks before, plus this one's; sent
      // on towards the block's owner (which is `next` after the last step). Its buffer's
      // previous send (two steps ago) completes first.
      acc_sends[s % 2].wait();
      float* acc_out = acc_outs[s % 2];
      if (s >= 2) {
        acc_recv.wait();
        be_.add(acc_out, acc_in, contrib, n);
      } else {
        be_.copy_d2d(acc_out, contrib, sizeof(float) * size_t(n));
      }
      acc_sends[s % 2] = cp_.comm->send_async(acc_out, n, DType::F32, next, kTagAcc + s + 1);
      stats_.bytes_sent += n * 4;
    }
    send.wait();
    recv.wait();
    if (s + 1 < cp) std::swap(cur, nxt);
    stats_.wait_s += now_seconds() - t;
  }
  pending_.clear();
  // This rank's own block comes home with everyone else's dK/dV contributions.
  const double t = now_seconds();
  float* home = home_.ensure_n<float>(be_, nb, "ring_attention");
  cp_.comm->recv(home, n, DType::F32, prev, kTagAcc + cp);
  acc_sends[0].wait();
  acc_sends[1].wait();
  stats_.wait_s += now_seconds() - t;
  be_.add_2d(dk_loc, ld, home, 2 * W, rows, 2 * W);
}

static const CpBatch& shards_of(const ModelInput& in, int cp) {
  LOOM_CHECK(in.cp && static_cast<int>(in.cp->shards.size()) == cp,
             "a context-parallel model needs ModelInput::cp (the shards of ", cp, " ranks)");
  return *in.cp;
}

void RingAttention::forward(float* out, float* lse, const float* qkv, int ld, int Hq, int Hkv,
                            int D, float scale, const ModelInput& in) {
  forward(out, lse, qkv, ld, Hq, Hkv, D, scale, shards_of(in, cp_.size));
}

void RingAttention::backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int ld, int Hq, int Hkv, int D, float scale,
                             const ModelInput& in) {
  backward(dqkv, dout, qkv, out, lse, ld, Hq, Hkv, D, scale, shards_of(in, cp_.size));
}

void RingAttention::sum_sequence_parts(double* sums, int nseq) {
  cp_.comm->all_reduce_f64(sums, nseq, comm::ReduceOp::Sum);
}

}  // namespace loom

namespace loom::parallel {

std::unique_ptr<AttentionCore> make_ring_attention(const ContextParallel& cp, Backend& be) {
  return std::make_unique<RingAttention>(cp, be);
}

ContextParallel context_parallel_layout(comm::Communicator& group) {
  return {group.size(), group.rank(), &group, &make_ring_attention};
}

}  // namespace loom::parallel
