// Communicator over MPI (OpenMPI from Debian). Asynchronous calls use MPI's non-blocking
// collectives; Work::test() calls MPI_Test, which also drives MPI's progress engine, so callers
// that poll between pieces of computation (the gradient buckets do, once per layer) keep
// collectives moving while they compute.
#include "comm/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace loom::comm::detail {

namespace {

void check_mpi(int rc, const std::string& comm, const char* op) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail(comm, ": MPI ", op, " failed: ", std::string(msg, len));
}

MPI_Datatype mpi_type(DType t, bool reduce, const std::string& comm) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
    case DType::BF16:
    case DType::F16:
    case DType::U16:
      // Moving 16-bit values is a copy; reducing them needs a custom op (not provided).
      LOOM_CHECK(!reduce, comm, ": reductions over ", dtype_name(t), " are not supported");
      return MPI_UINT16_T;
    case DType::F8E4M3:
    case DType::F8E5M2:
      LOOM_CHECK(!reduce, comm, ": reductions over ", dtype_name(t), " are not supported");
      return MPI_UINT8_T;
  }
  fail(comm, ": unsupported dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::Max ? MPI_MAX : MPI_SUM;
}

int to_int(int64_t n, const std::string& comm) {
  LOOM_CHECK(n >= 0 && n <= INT_MAX, comm, ": message of ", n,
             " elements exceeds MPI's int count; split it");
  return static_cast<int>(n);
}

// One request plus what must outlive it (count arrays) and a completion step (averaging).
struct MpiWork : Work::Impl {
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> counts, displs, recv_counts, recv_displs;
  std::function<void()> on_done;
  std::string what;
  bool done = false;

  void finish() {
    done = true;
    if (on_done) on_done();
  }
  bool test() override {
    if (done) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), what, "test");
    if (flag) finish();
    return done;
  }
  void wait() override {
    if (done) return;
    check_mpi(MPI_Wait(&req, MPI_STATUS_IGNORE), what, "wait");
    finish();
  }
};

void scale(void* buf, int64_t n, DType t, double s) {
  LOOM_CHECK(t == DType::F32, "average needs fp32 data, got ", dtype_name(t));
  float* f = static_cast<float*>(buf);
  for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(f[i] * s);
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, bool owned)
      : comm_(comm), name_(std::move(name)), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    // Translate every group rank to its world rank once (error messages name world ranks).
    MPI_Group g, w;
    MPI_Comm_group(comm_, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &w);
    std::vector<int> mine(size_);
    for (int i = 0; i < size_; ++i) mine[i] = i;
    world_ranks_.resize(size_);
    MPI_Group_translate_ranks(g, size_, mine.data(), w, world_ranks_.data());
    MPI_Group_free(&g);
    MPI_Group_free(&w);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank_of(int r) const override { return world_ranks_.at(r); }
  std::string name() const override { return name_; }

  Work all_reduce_async(void* buf, int64_t n, DType t, ReduceOp op) override {
    auto w = start("all_reduce");
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(n, name_), mpi_type(t, true, name_),
                             mpi_op(op), comm_, &w->req),
              name_, "all_reduce");
    if (op == ReduceOp::Avg) w->on_done = [=, s = 1.0 / size_] { scale(buf, n, t, s); };
    return Work(w);
  }

  void all_reduce_f64(double* buf, int64_t n, ReduceOp op) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, to_int(n, name_), MPI_DOUBLE, mpi_op(op), comm_),
              name_, "all_reduce");
    if (op == ReduceOp::Avg)
      for (int64_t i = 0; i < n; ++i) buf[i] /= size_;
  }

  Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DType t, ReduceOp op) override {
    LOOM_CHECK(static_cast<int>(counts.size()) == size_, name_, ": reduce_scatter needs ", size_,
               " counts, got ", counts.size());
    auto w = start("reduce_scatter");
    for (int64_t c : counts) w->counts.push_back(to_int(c, name_));
    check_mpi(MPI_Ireduce_scatter(send, recv, w->counts.data(), mpi_type(t, true, name_),
                                  mpi_op(op), comm_, &w->req),
              name_, "reduce_scatter");
    int64_t mine = counts[rank_];
    if (op == ReduceOp::Avg) w->on_done = [=, s = 1.0 / size_] { scale(recv, mine, t, s); };
    return Work(w);
  }

  // An all-to-all of the bf16 blocks (each rank sends block r to rank r: the other ranks'
  // blocks once, what a ring reduce-scatter sends) and the sum in fp32 on arrival. Not an MPI
  // user-defined op: its partial results have the operand type, so every hop would round to
  // bf16, in an order that depends on MPI's algorithm.
  Work reduce_scatter_bf16_async(const uint16_t* send, float* recv,
                                 const std::vector<int64_t>& counts) override {
    LOOM_CHECK(static_cast<int>(counts.size()) == size_, name_, ": reduce_scatter needs ", size_,
               " counts, got ", counts.size());
    auto w = start("reduce_scatter_bf16");
    const int mine = to_int(counts[rank_], name_);
    auto blocks = std::make_shared<std::vector<uint16_t>>(int64_t(mine) * size_);
    int64_t off = 0;
    for (int r = 0; r < size_; ++r) {
      w->counts.push_back(to_int(counts[r], name_));
      w->displs.push_back(to_int(off, name_));
      off += counts[r];
      w->recv_counts.push_back(mine);
      w->recv_displs.push_back(to_int(int64_t(r) * mine, name_));
    }
    check_mpi(
        MPI_Ialltoallv(send, w->counts.data(), w->displs.data(), MPI_UINT16_T, blocks->data(),
                       w->recv_counts.data(), w->recv_displs.data(), MPI_UINT16_T, comm_, &w->req),
        name_, "reduce_scatter_bf16");
    w->on_done = [blocks, recv, mine, n = size_] {
      const uint16_t* b = blocks->data();
      for (int64_t i = 0; i < mine; ++i) recv[i] = bf16_to_f32(b[i]);
      for (int r = 1; r < n; ++r)
        for (int64_t i = 0; i < mine; ++i) recv[i] += bf16_to_f32(b[int64_t(r) * mine + i]);
    };
    return Work(w);
  }

  Work all_gather_async(void* buf, const std::vector<int64_t>& counts, DType t) override {
    LOOM_CHECK(static_cast<int>(counts.size()) == size_, name_, ": all_gather needs ", size_,
               " counts, got ", counts.size());
    auto w = start("all_gather");
    int64_t off = 0;
    for (int64_t c : counts) {
      w->counts.push_back(to_int(c, name_));
      w->displs.push_back(to_int(off, name_));
      off += c;
    }
    check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, w->counts.data(),
                              w->displs.data(), mpi_type(t, false, name_), comm_, &w->req),
              name_, "all_gather");
    return Work(w);
  }

  Work broadcast_async(void* buf, int64_t n, DType t, int root) override {
    LOOM_CHECK(root >= 0 && root < size_, name_, ": broadcast root ", root, " out of range");
    auto w = start("broadcast");
    check_mpi(MPI_Ibcast(buf, to_int(n, name_), mpi_type(t, false, name_), root, comm_, &w->req),
              name_, "broadcast");
    return Work(w);
  }

  Work send_async(const void* buf, int64_t n, DType t, int peer, int tag) override {
    LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, ": bad send peer ", peer);
    auto w = start("send");
    check_mpi(
        MPI_Isend(buf, to_int(n, name_), mpi_type(t, false, name_), peer, tag, comm_, &w->req),
        name_, "send");
    return Work(w);
  }

  Work recv_async(void* buf, int64_t n, DType t, int peer, int tag) override {
    LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, ": bad receive peer ", peer);
    auto w = start("recv");
    check_mpi(
        MPI_Irecv(buf, to_int(n, name_), mpi_type(t, false, name_), peer, tag, comm_, &w->req),
        name_, "recv");
    return Work(w);
  }

  Work all_to_all_async(const void* send, void* recv, int64_t n, DType t) override {
    auto w = start("all_to_all");
    MPI_Datatype dt = mpi_type(t, false, name_);
    check_mpi(MPI_Ialltoall(send, to_int(n, name_), dt, recv, to_int(n, name_), dt, comm_, &w->req),
              name_, "all_to_all");
    return Work(w);
  }

  void barrier() override { check_mpi(MPI_Barrier(comm_), name_, "barrier"); }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MPI_Comm sub;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), name_, "split");
    return std::make_unique<MpiCommunicator>(sub, name, true);
  }

 private:
  std::shared_ptr<MpiWork> start(const char* op) {
    auto w = std::make_shared<MpiWork>();
    w->what = name_ + " " + op;
    return w;
  }

  MPI_Comm comm_;
  std::string name_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
};

}  // namespace

bool mpi_initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

std::unique_ptr<Communicator> make_mpi_world() {
  if (!mpi_initialized()) {
    int provided = 0;
    // Only the main thread calls MPI (OpenMP threads compute, never communicate).
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", false);
}

void mpi_abort(int code) {
  if (mpi_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void mpi_finalize() {
  if (mpi_initialized()) MPI_Finalize();
}

}  // namespace loom::comm::detail
