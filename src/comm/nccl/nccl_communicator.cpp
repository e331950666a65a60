#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fs.h"

namespace loom::comm {
namespace {

#define LOOM_NCCL_CHECK(call)                                              \
  do {                                                                     \
    const ncclResult_t loom_r_ = (call);                                   \
    if (loom_r_ != ncclSuccess)                                            \
      ::loom::fail("NCCL error in ", #call, " (", __FILE__, ":", __LINE__, \
                   "): ", ncclGetErrorString(loom_r_));                    \
  } while (0)
#define LOOM_CUDA_OK(call)                                                 \
  do {                                                                     \
    const cudaError_t loom_e_ = (call);                                    \
    if (loom_e_ != cudaSuccess)                                            \
      ::loom::fail("CUDA error in ", #call, " (", __FILE__, ":", __LINE__, \
                   "): ", cudaGetErrorString(loom_e_));                    \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
    case DType::F8E4M3:
      return ncclFloat8e4m3;
    case DType::F8E5M2:
      return ncclFloat8e5m2;
    default:
      fail("NCCL communicator: unsupported dtype ", dtype_name(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::Sum ? ncclSum : op == ReduceOp::Avg ? ncclAvg : ncclMax;
}

// Completion of one operation: an event on the communication stream.
class NcclWork : public Work::Impl {
 public:
  NcclWork(cudaStream_t comm, cudaStream_t compute, ncclComm_t c) : compute_(compute), comm_(c) {
    LOOM_CUDA_OK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    LOOM_CUDA_OK(cudaEventRecord(done_, comm));
  }
  ~NcclWork() override { cudaEventDestroy(done_); }
  bool test() override {
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) {
      check_async();
      return false;
    }
    LOOM_CUDA_OK(e);
    return true;
  }
  void wait() override {
    // Device-side: later compute kernels see the result; host-side: block until done,
    // checking for NCCL failures (a dead peer) instead of hanging silently.
    LOOM_CUDA_OK(cudaStreamWaitEvent(compute_, done_, 0));
    while (!test()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

 private:
  void check_async() {
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
      fail("NCCL communicator failed while waiting: ", ncclGetErrorString(r));
  }
  cudaEvent_t done_ = nullptr;
  cudaStream_t compute_;
  ncclComm_t comm_;
};

class NcclCommunicator;

// A point-to-point message not yet issued: sends and receives wait in the communicator until
// the first wait() or test() on any of them, or the next collective, issues every pending one
// in one ncclGroupStart/End (see flush_p2p).
struct P2pSlot {
  std::shared_ptr<NcclWork> done;  // set when issued
};

class NcclP2pWork : public Work::Impl {
 public:
  NcclP2pWork(NcclCommunicator& c, std::shared_ptr<P2pSlot> slot)
      : comm_(c), slot_(std::move(slot)) {}
  bool test() override;
  void wait() override;

 private:
  NcclCommunicator& comm_;
  std::shared_ptr<P2pSlot> slot_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, cudaStream_t compute, std::string name,
                   std::vector<int> world_ranks)
      : comm_(comm),
        device_(device),
        compute_(compute),
        name_(std::move(name)),
        world_ranks_(std::move(world_ranks)) {
    LOOM_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    LOOM_NCCL_CHECK(ncclCommCount(comm_, &size_));
    LOOM_CUDA_OK(cudaSetDevice(device_));
    int lo = 0, hi = 0;
    LOOM_CUDA_OK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    // Highest priority: reductions are scheduled ahead of compute kernels when both wait.
    LOOM_CUDA_OK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi));
    LOOM_CUDA_OK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    LOOM_CUDA_OK(cudaMalloc(&scratch_, kScratch * sizeof(double)));
  }
  ~NcclCommunicator() override {
    try {
      flush_p2p();  // (a message nobody waited for still has its peer waiting for it)
    } catch (...) {
    }
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) ncclCommDestroy(comm_);
    if (scratch_) cudaFree(scratch_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank_of(int r) const override {
    LOOM_CHECK(r >= 0 && r < size_, name_, ": rank ", r, " outside a group of ", size_);
    return world_ranks_[r];
  }
  std::string name() const override { return name_; }

  Work all_reduce_async(void* buf, int64_t n, DType t, ReduceOp op) override {
    begin();
    LOOM_NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), comm_, stream_));
    return end();
  }

  Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DType t, ReduceOp op) override {
    check_counts(counts, "reduce_scatter");
    const size_t es = dtype_size(t);
    begin();
    if (equal(counts)) {
      LOOM_NCCL_CHECK(
          ncclReduceScatter(send, recv, counts[0], nccl_type(t), nccl_op(op), comm_, stream_));
    } else {
      // Uneven blocks: one reduce per block, rooted at its owner, grouped into one launch.
      LOOM_NCCL_CHECK(ncclGroupStart());
      int64_t displ = 0;
      for (int r = 0; r < size_; ++r) {
        LOOM_NCCL_CHECK(ncclReduce(static_cast<const char*>(send) + displ * es, recv, counts[r],
                                   nccl_type(t), nccl_op(op), r, comm_, stream_));
        displ += counts[r];
      }
      LOOM_NCCL_CHECK(ncclGroupEnd());
    }
    return end();
  }

  // The bf16 blocks exchanged on the device (ncclBfloat16 sends and receives, each rank's
  // block r to rank r), then summed in fp32 in rank order. The sum runs on the host (the comm
  // library has no kernels): correct, blocking and slow; the data-parallel engine that uses it
  // works on host buffers today. A device kernel would keep it on the stream.
  Work reduce_scatter_bf16_async(const uint16_t* send, float* recv,
                                 const std::vector<int64_t>& counts) override {
    check_counts(counts, "reduce_scatter_bf16");
    const int64_t mine = counts[rank_];
    uint16_t* blocks = nullptr;
    if (mine > 0) LOOM_CUDA_OK(cudaMalloc(&blocks, size_ * mine * sizeof(uint16_t)));
    begin();
    LOOM_NCCL_CHECK(ncclGroupStart());
    int64_t displ = 0;
    for (int r = 0; r < size_; ++r) {
      if (counts[r] > 0)
        LOOM_NCCL_CHECK(ncclSend(send + displ, counts[r], ncclBfloat16, r, comm_, stream_));
      if (mine > 0)
        LOOM_NCCL_CHECK(ncclRecv(blocks + r * mine, mine, ncclBfloat16, r, comm_, stream_));
      displ += counts[r];
    }
    LOOM_NCCL_CHECK(ncclGroupEnd());
    end().wait();
    if (mine == 0) return {};
    std::vector<uint16_t> host(size_ * mine);
    LOOM_CUDA_OK(
        cudaMemcpy(host.data(), blocks, host.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    LOOM_CUDA_OK(cudaFree(blocks));
    std::vector<float> sum(mine);
    for (int64_t i = 0; i < mine; ++i) sum[i] = bf16_to_f32(host[i]);
    for (int r = 1; r < size_; ++r)
      for (int64_t i = 0; i < mine; ++i) sum[i] += bf16_to_f32(host[r * mine + i]);
    // On the compute stream, which later kernels reading `recv` use: a plain cudaMemcpy from
    // pageable memory may return before its DMA lands, and the legacy default stream does not
    // order with a non-blocking compute stream. The synchronize keeps `sum` alive until then.
    LOOM_CUDA_OK(
        cudaMemcpyAsync(recv, sum.data(), mine * sizeof(float), cudaMemcpyHostToDevice, compute_));
    LOOM_CUDA_OK(cudaStreamSynchronize(compute_));
    return {};
  }

  Work all_gather_async(void* buf, const std::vector<int64_t>& counts, DType t) override {
    check_counts(counts, "all_gather");
    const size_t es = dtype_size(t);
    char* b = static_cast<char*>(buf);
    begin();
    if (equal(counts)) {
      LOOM_NCCL_CHECK(
          ncclAllGather(b + rank_ * counts[0] * es, b, counts[0], nccl_type(t), comm_, stream_));
    } else {
      LOOM_NCCL_CHECK(ncclGroupStart());
      int64_t displ = 0;
      for (int r = 0; r < size_; ++r) {
        LOOM_NCCL_CHECK(ncclBroadcast(b + displ * es, b + displ * es, counts[r], nccl_type(t), r,
                                      comm_, stream_));
        displ += counts[r];
      }
      LOOM_NCCL_CHECK(ncclGroupEnd());
    }
    return end();
  }

  Work broadcast_async(void* buf, int64_t n, DType t, int root) override {
    LOOM_CHECK(root >= 0 && root < size_, name_, ": broadcast root ", root, " outside the group");
    begin();
    LOOM_NCCL_CHECK(ncclBroadcast(buf, buf, n, nccl_type(t), root, comm_, stream_));
    return end();
  }

  // Point to point. NCCL has no tags: it matches the k-th send from rank a to rank b with the
  // k-th receive on b from a. The messages wait here and go out together at the first wait()
  // or test() on one of them (or the next collective), in one ncclGroupStart/End: a ring step's
  // send to rank+1 and receive from rank-1 run concurrently instead of deadlocking on one
  // stream, and everything pending is issued in the order it was called. So `tag` is not
  // matched: callers issue, for each ordered pair of ranks, sends and receives in the same
  // order (the ring attention's steps do; docs/parallel.md "Parallelism on the device"); the
  // tag is checked only to be non-negative.
  Work send_async(const void* buf, int64_t n, DType t, int peer, int tag) override {
    return post(true, const_cast<void*>(buf), n, t, peer, tag);
  }

  Work recv_async(void* buf, int64_t n, DType t, int peer, int tag) override {
    return post(false, buf, n, t, peer, tag);
  }

  // Issues every pending point-to-point message (no-op when none).
  void flush_p2p() {
    if (pending_.empty()) return;
    std::vector<Pending> ops;
    ops.swap(pending_);
    begin_stream();
    LOOM_NCCL_CHECK(ncclGroupStart());
    for (const Pending& p : ops) {
      if (p.send)
        LOOM_NCCL_CHECK(ncclSend(p.buf, p.n, nccl_type(p.t), p.peer, comm_, stream_));
      else
        LOOM_NCCL_CHECK(ncclRecv(p.buf, p.n, nccl_type(p.t), p.peer, comm_, stream_));
    }
    LOOM_NCCL_CHECK(ncclGroupEnd());
    auto done = std::make_shared<NcclWork>(stream_, compute_, comm_);
    for (const Pending& p : ops) p.slot->done = done;
  }

  Work all_to_all_async(const void* send, void* recv, int64_t n, DType t) override {
    const size_t bytes = n * dtype_size(t);
    begin();
    LOOM_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      LOOM_NCCL_CHECK(
          ncclSend(static_cast<const char*>(send) + r * bytes, n, nccl_type(t), r, comm_, stream_));
      LOOM_NCCL_CHECK(
          ncclRecv(static_cast<char*>(recv) + r * bytes, n, nccl_type(t), r, comm_, stream_));
    }
    LOOM_NCCL_CHECK(ncclGroupEnd());
    return end();
  }

  void barrier() override {
    begin();
    LOOM_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat64, ncclSum, comm_, stream_));
    end().wait();
  }

  // Host doubles: staged through the device scratch in chunks.
  void all_reduce_f64(double* buf, int64_t n, ReduceOp op) override {
    flush_p2p();
    for (int64_t off = 0; off < n; off += kScratch) {
      const int64_t m = std::min<int64_t>(kScratch, n - off);
      LOOM_CUDA_OK(cudaMemcpyAsync(scratch_, buf + off, m * sizeof(double), cudaMemcpyHostToDevice,
                                   stream_));
      LOOM_NCCL_CHECK(
          ncclAllReduce(scratch_, scratch_, m, ncclFloat64, nccl_op(op), comm_, stream_));
      LOOM_CUDA_OK(cudaMemcpyAsync(buf + off, scratch_, m * sizeof(double), cudaMemcpyDeviceToHost,
                                   stream_));
      LOOM_CUDA_OK(cudaStreamSynchronize(stream_));
    }
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    flush_p2p();
    LOOM_CUDA_OK(cudaStreamSynchronize(stream_));
    ncclComm_t sub = nullptr;
    LOOM_NCCL_CHECK(
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr));
    LOOM_CHECK(sub != nullptr, name_, ": split with a negative color gives no communicator");
    auto c = std::make_unique<NcclCommunicator>(sub, device_, compute_, name, std::vector<int>{});
    c->world_ranks_ = c->gather_world_ranks(&world_ranks_[rank_]);
    return c;
  }

 private:
  static constexpr int64_t kScratch = 1024;  // doubles

  // World rank of every rank of this group: all-reduce of a one-hot vector.
  std::vector<int> gather_world_ranks(const int* mine) {
    std::vector<double> v(size_, 0.0);
    v[rank_] = mine ? *mine : rank_;
    all_reduce_f64(v.data(), size_, ReduceOp::Sum);
    return std::vector<int>(v.begin(), v.end());
  }
  void begin() {
    flush_p2p();  // the stream runs the communicator's operations in the order they were called
    begin_stream();
  }
  void begin_stream() {
    LOOM_CUDA_OK(cudaEventRecord(ready_, compute_));
    LOOM_CUDA_OK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  Work end() { return Work(std::make_shared<NcclWork>(stream_, compute_, comm_)); }
  struct Pending {
    bool send;
    void* buf;
    int64_t n;
    DType t;
    int peer;
    std::shared_ptr<P2pSlot> slot;
  };
  Work post(bool send, void* buf, int64_t n, DType t, int peer, int tag) {
    check_peer(peer);
    LOOM_CHECK(n >= 0 && tag >= 0, name_, ": bad ", send ? "send" : "receive", " of ", n,
               " elements with tag ", tag);
    nccl_type(t);  // an unsupported type fails here, not at the flush
    auto slot = std::make_shared<P2pSlot>();
    pending_.push_back({send, buf, n, t, peer, slot});
    return Work(std::make_shared<NcclP2pWork>(*this, std::move(slot)));
  }
  bool equal(const std::vector<int64_t>& c) const {
    return std::all_of(c.begin(), c.end(), [&](int64_t x) { return x == c[0]; });
  }
  void check_counts(const std::vector<int64_t>& c, const char* op) const {
    LOOM_CHECK(c.size() == size_t(size_), name_, ": ", op, " needs one count per rank (", size_,
               "), got ", c.size());
  }
  void check_peer(int peer) const {
    LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, ": bad peer rank ", peer);
  }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  double* scratch_ = nullptr;
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_ = 0, size_ = 1;
  std::vector<Pending> pending_;  // point-to-point messages not issued yet
};

bool NcclP2pWork::test() {
  if (!slot_->done) comm_.flush_p2p();
  return slot_->done->test();
}

void NcclP2pWork::wait() {
  if (!slot_->done) comm_.flush_p2p();
  slot_->done->wait();
}

std::unique_ptr<Communicator> make_from_id(const ncclUniqueId& id, int rank, int size, int device,
                                           void* compute_stream, const std::string& name,
                                           std::vector<int> world_ranks) {
  LOOM_CUDA_OK(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  LOOM_NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  return std::make_unique<NcclCommunicator>(comm, device, static_cast<cudaStream_t>(compute_stream),
                                            name, std::move(world_ranks));
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     void* compute_stream,
                                                     const std::string& name) {
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) LOOM_NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap.broadcast(&id, sizeof id, DType::U8, 0);  // host bytes through the bootstrap
  std::vector<int> world(bootstrap.size());
  for (int r = 0; r < bootstrap.size(); ++r) world[r] = bootstrap.world_rank_of(r);
  return make_from_id(id, bootstrap.rank(), bootstrap.size(), device, compute_stream, name,
                      std::move(world));
}

std::unique_ptr<Communicator> make_nccl_communicator_file(const std::string& path, int rank,
                                                          int size, int device,
                                                          void* compute_stream, double timeout_s,
                                                          const std::string& name) {
  LOOM_CHECK(rank >= 0 && rank < size, "NCCL rendezvous: rank ", rank, " outside [0, ", size, ")");
  ncclUniqueId id{};
  if (rank == 0) {
    LOOM_NCCL_CHECK(ncclGetUniqueId(&id));
    write_file_atomic(path, std::string_view(id.internal, sizeof id.internal));
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    while (!std::filesystem::exists(path)) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      LOOM_CHECK(waited < timeout_s, "NCCL rendezvous: ", path, " did not appear within ",
                 timeout_s, " s (is rank 0 running?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const std::string s = read_file(path);
    LOOM_CHECK(s.size() == sizeof id.internal, "NCCL rendezvous: ", path, " holds ", s.size(),
               " bytes, expected ", sizeof id.internal);
    std::memcpy(id.internal, s.data(), s.size());
  }
  std::vector<int> world(size);
  std::iota(world.begin(), world.end(), 0);
  return make_from_id(id, rank, size, device, compute_stream, name, std::move(world));
}

}  // namespace loom::comm
