// The one-rank communicator: collectives over a single rank reduce to copies.
#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"

namespace loom::comm {

const char* reduce_op_name(ReduceOp op) {
  return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Avg ? "avg" : "max";
}

double Communicator::all_reduce_scalar(double x, ReduceOp op) {
  double v = x;
  all_reduce_f64(&v, 1, op);
  return v;
}

int64_t Communicator::all_reduce_scalar(int64_t x, ReduceOp op) {
  LOOM_CHECK(op != ReduceOp::Avg, "integer all-reduce cannot average");
  int64_t v = x;
  all_reduce(&v, 1, DType::I64, op);
  return v;
}

namespace {

class SelfCommunicator : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int world_rank_of(int r) const override { return r; }
  std::string name() const override { return name_; }

  Work all_reduce_async(void*, int64_t, DType, ReduceOp) override { return {}; }
  void all_reduce_f64(double*, int64_t, ReduceOp) override {}
  Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DType t, ReduceOp) override {
    LOOM_CHECK(counts.size() == 1, name_, ": reduce_scatter needs one count per rank");
    std::memmove(recv, send, counts[0] * dtype_size(t));
    return {};
  }
  Work reduce_scatter_bf16_async(const uint16_t* send, float* recv,
                                 const std::vector<int64_t>& counts) override {
    LOOM_CHECK(counts.size() == 1, name_, ": reduce_scatter needs one count per rank");
    for (int64_t i = 0; i < counts[0]; ++i) recv[i] = bf16_to_f32(send[i]);
    return {};
  }
  Work all_gather_async(void*, const std::vector<int64_t>& counts, DType) override {
    LOOM_CHECK(counts.size() == 1, name_, ": all_gather needs one count per rank");
    return {};
  }
  Work broadcast_async(void*, int64_t, DType, int root) override {
    LOOM_CHECK(root == 0, name_, ": broadcast root ", root, " outside a group of one rank");
    return {};
  }
  Work send_async(const void*, int64_t, DType, int peer, int) override {
    fail(name_, ": send to rank ", peer, " in a group of one rank");
  }
  Work recv_async(void*, int64_t, DType, int peer, int) override {
    fail(name_, ": receive from rank ", peer, " in a group of one rank");
  }
  Work all_to_all_async(const void* send, void* recv, int64_t n, DType t) override {
    std::memmove(recv, send, n * dtype_size(t));
    return {};
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int, const std::string& name) override {
    return std::make_unique<SelfCommunicator>(name);
  }

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator(const std::string& name) {
  return std::make_unique<SelfCommunicator>(name);
}

}  // namespace loom::comm
