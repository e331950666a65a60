// A tensor-parallel group of two ranks played by one process: rank 0, whose partner is assumed
// to hold the same data (a mirror). Sums double (x + x), maxima stay, gathers copy this rank's
// block into the partner's, reduce-scatters give twice this rank's block, an all-to-all
// receives what it sends, and a receive gets the message this rank sent with the same tag
// (the partner sends the same; the ring of context parallelism). Every byte moves
// through a Backend op (copy_d2d, scale_inplace), so a model run over it on a guarded backend
// (tests/kernels/guarded_backend.h) exercises the tensor-parallel paths end to end, with the
// communication where a device communicator (NCCL) would do it: a host loop anywhere in those
// paths faults. The numbers are not a real two-rank model's (tests/parallel checks those).
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "parallel/refusing_communicator.h"

namespace loom::test {

class MirrorCommunicator final : public RefusingCommunicator {
 public:
  explicit MirrorCommunicator(Backend& be) : RefusingCommunicator("mirror", 0, 2), be_(be) {}

  comm::Work all_reduce_async(void* buf, int64_t n, DType t, comm::ReduceOp op) override {
    if (op == comm::ReduceOp::Max) return {};  // the maximum of equal values (host or device)
    LOOM_CHECK(t == DType::F32, "mirror communicator: fp32 sums only");
    if (op == comm::ReduceOp::Sum) be_.scale_inplace(static_cast<float*>(buf), 2.f, n);
    return {};
  }
  comm::Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                                  DType t, comm::ReduceOp op) override {
    LOOM_CHECK(t == DType::F32 && op == comm::ReduceOp::Sum, "mirror communicator: fp32 sums");
    be_.copy_d2d(recv, send, size_t(counts[0]) * sizeof(float));
    be_.scale_inplace(static_cast<float*>(recv), 2.f, counts[0]);
    return {};
  }
  comm::Work all_gather_async(void* buf, const std::vector<int64_t>& counts, DType t) override {
    const size_t bytes = size_t(counts[0]) * dtype_size(t);
    be_.copy_d2d(static_cast<char*>(buf) + bytes, buf, bytes);
    return {};
  }
  comm::Work broadcast_async(void*, int64_t, DType, int) override { return {}; }
  // A message waits for its match by tag; the copy happens when both sides are posted (the
  // sender keeps its buffer intact until it waits, as MPI requires).
  comm::Work send_async(const void* buf, int64_t n, DType t, int, int tag) override {
    const size_t bytes = size_t(n) * dtype_size(t);
    if (auto it = recvs_.find(tag); it != recvs_.end()) {
      LOOM_CHECK(it->second.bytes == bytes, "mirror communicator: message size mismatch, tag ",
                 tag);
      be_.copy_d2d(it->second.p, buf, bytes);
      recvs_.erase(it);
    } else {
      sends_[tag] = {const_cast<void*>(buf), bytes};
    }
    return {};
  }
  comm::Work recv_async(void* buf, int64_t n, DType t, int, int tag) override {
    const size_t bytes = size_t(n) * dtype_size(t);
    if (auto it = sends_.find(tag); it != sends_.end()) {
      LOOM_CHECK(it->second.bytes == bytes, "mirror communicator: message size mismatch, tag ",
                 tag);
      be_.copy_d2d(buf, it->second.p, bytes);
      sends_.erase(it);
    } else {
      recvs_[tag] = {buf, bytes};
    }
    return {};
  }
  comm::Work all_to_all_async(const void* send, void* recv, int64_t n, DType t) override {
    be_.copy_d2d(recv, send, 2 * size_t(n) * dtype_size(t));
    return {};
  }
  // Messages posted without their match (a ring that lost a step).
  size_t unmatched() const { return sends_.size() + recvs_.size(); }
  void all_reduce_f64(double* buf, int64_t n, comm::ReduceOp op) override {
    if (op == comm::ReduceOp::Sum)
      for (int64_t i = 0; i < n; ++i) buf[i] *= 2;
  }

 private:
  struct Msg {
    void* p;
    size_t bytes;
  };
  Backend& be_;
  std::map<int, Msg> sends_, recvs_;
};

}  // namespace loom::test
