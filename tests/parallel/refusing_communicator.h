// The base of the tests' fake communicators: a group of ranks played by one process, in which
// every collective and point-to-point operation fails, naming the fake and the operation. A fake
// overrides only what the code under test should call, so any other call is an error, not a
// silent no-op. A barrier carries no data, so it passes.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"

namespace loom::test {

class RefusingCommunicator : public comm::Communicator {
 public:
  RefusingCommunicator(std::string name, int rank, int size)
      : name_(std::move(name)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank_of(int r) const override { return r; }
  std::string name() const override { return name_; }

  comm::Work all_reduce_async(void*, int64_t, DType, comm::ReduceOp) override {
    refuse("all_reduce");
  }
  comm::Work reduce_scatter_async(const void*, void*, const std::vector<int64_t>&, DType,
                                  comm::ReduceOp) override {
    refuse("reduce_scatter");
  }
  comm::Work all_gather_async(void*, const std::vector<int64_t>&, DType) override {
    refuse("all_gather");
  }
  comm::Work reduce_scatter_bf16_async(const uint16_t*, float*,
                                       const std::vector<int64_t>&) override {
    refuse("reduce_scatter_bf16");
  }
  comm::Work broadcast_async(void*, int64_t, DType, int) override { refuse("broadcast"); }
  comm::Work send_async(const void*, int64_t, DType, int, int) override { refuse("send"); }
  comm::Work recv_async(void*, int64_t, DType, int, int) override { refuse("recv"); }
  comm::Work all_to_all_async(const void*, void*, int64_t, DType) override { refuse("all_to_all"); }
  void barrier() override {}
  void all_reduce_f64(double*, int64_t, comm::ReduceOp) override { refuse("all_reduce_f64"); }
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { refuse("split"); }

 private:
  [[noreturn]] void refuse(const char* op) const {
    fail(name_, " communicator: ", op, " is not modelled by this test fake");
  }
  std::string name_;
  int rank_, size_;
};

}  // namespace loom::test
