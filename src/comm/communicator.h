// Communicators: collective and point-to-point operations over contiguous device buffers, each
// available as an asynchronous call that returns a Work handle to wait on (so communication
// overlaps computation) and as a blocking wrapper. No MPI (or NCCL) type appears here: the CPU
// implementation is MPI (mpi_communicator.cpp), a CUDA one would wrap NCCL behind the same calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom::comm {

enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

// A handle on an operation in flight. wait() blocks until it completed (and ran its completion
// step, e.g. the division of an average); test() makes progress and reports completion without
// blocking. A default-constructed Work is already complete. Copies share the operation.
class Work {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool test() = 0;  // true once complete; idempotent afterwards
    virtual void wait() = 0;
  };
  Work() = default;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait() {
    if (impl_) impl_->wait();
  }
  bool test() { return !impl_ || impl_->test(); }
  bool pending() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<Impl> impl_;
};

// Element counts are per rank where a vector is taken (`counts[r]` elements for rank r, laid
// out back to back in rank order); sizes may differ between ranks, including zero.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank in the world communicator of this group's rank `r` (for messages naming a rank).
  virtual int world_rank_of(int r) const = 0;
  virtual std::string name() const = 0;

  // buf[n] <- op over ranks of buf[n], in place.
  virtual Work all_reduce_async(void* buf, int64_t n, DType t, ReduceOp op) = 0;
  // send holds sum(counts) elements; recv[counts[rank]] <- op over ranks of this rank's block.
  // send and recv must not overlap.
  virtual Work reduce_scatter_async(const void* send, void* recv,
                                    const std::vector<int64_t>& counts, DType t, ReduceOp op) = 0;
  // In place: buf holds sum(counts) elements and this rank's block already sits at its
  // displacement; afterwards every rank holds every block.
  virtual Work all_gather_async(void* buf, const std::vector<int64_t>& counts, DType t) = 0;
  // Reduce-scatter of fp32 sums with bf16 payloads: send holds sum(counts) bf16 values (this
  // rank's contribution, already rounded); recv[counts[rank]] (fp32) <- the sum over ranks of
  // their bf16 blocks for this rank, accumulated in fp32 in rank order 0, 1, ..., size-1 (the
  // same bits on every implementation; the sum is not rounded back to bf16). Half the bytes of
  // an fp32 reduce-scatter on the wire; a reduction op over bf16 (MPI's or NCCL's) would round
  // every partial sum to bf16 instead.
  virtual Work reduce_scatter_bf16_async(const uint16_t* send, float* recv,
                                         const std::vector<int64_t>& counts) = 0;
  virtual Work broadcast_async(void* buf, int64_t n, DType t, int root) = 0;
  virtual Work send_async(const void* buf, int64_t n, DType t, int peer, int tag = 0) = 0;
  virtual Work recv_async(void* buf, int64_t n, DType t, int peer, int tag = 0) = 0;
  // send and recv hold size() blocks of n elements; block r of send goes to rank r, and block r
  // of recv comes from rank r.
  virtual Work all_to_all_async(const void* send, void* recv, int64_t n, DType t) = 0;
  virtual void barrier() = 0;
  // fp64 all-reduce (norms, loss sums, timings): DType has no fp64 tensor type.
  virtual void all_reduce_f64(double* buf, int64_t n, ReduceOp op) = 0;

  // A sub-communicator of the ranks that pass the same `color`, ordered by `key`. Collective:
  // every rank of this communicator calls it, in the same order.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Blocking forms.
  void all_reduce(void* buf, int64_t n, DType t, ReduceOp op) {
    all_reduce_async(buf, n, t, op).wait();
  }
  void reduce_scatter(const void* send, void* recv, const std::vector<int64_t>& counts, DType t,
                      ReduceOp op) {
    reduce_scatter_async(send, recv, counts, t, op).wait();
  }
  void reduce_scatter_bf16(const uint16_t* send, float* recv, const std::vector<int64_t>& counts) {
    reduce_scatter_bf16_async(send, recv, counts).wait();
  }
  void all_gather(void* buf, const std::vector<int64_t>& counts, DType t) {
    all_gather_async(buf, counts, t).wait();
  }
  void broadcast(void* buf, int64_t n, DType t, int root) {
    broadcast_async(buf, n, t, root).wait();
  }
  void send(const void* buf, int64_t n, DType t, int peer, int tag = 0) {
    send_async(buf, n, t, peer, tag).wait();
  }
  void recv(void* buf, int64_t n, DType t, int peer, int tag = 0) {
    recv_async(buf, n, t, peer, tag).wait();
  }
  void all_to_all(const void* send, void* recv, int64_t n, DType t) {
    all_to_all_async(send, recv, n, t).wait();
  }
  // Convenience scalars.
  double all_reduce_scalar(double x, ReduceOp op);
  int64_t all_reduce_scalar(int64_t x, ReduceOp op);
};

// A communicator of one rank: every collective is a copy or a no-op. Used when a process runs
// without a launcher, and for groups of size one.
std::unique_ptr<Communicator> make_self_communicator(const std::string& name = "self");

// The world: MPI when the process was started by a launcher (mpirun, srun, loom launch) and
// Loom was built with MPI; otherwise a self communicator. Initialised on first use.
Communicator& world();
// True when started by a launcher with more than one rank.
bool launched_distributed();
// Ends the whole job from this rank after printing `message` (named with this rank): no hang
// when the other ranks wait in a collective.
[[noreturn]] void abort_job(const std::string& message, int code = 1);
// Shuts MPI down cleanly at the end of a successful run (no-op without MPI).
void finalize();

}  // namespace loom::comm
