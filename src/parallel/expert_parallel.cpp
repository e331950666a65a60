#include "parallel/expert_parallel.h"

#include <algorithm>
#include <vector>

#include "kernels/buffer.h"

namespace loom::parallel {
namespace {

class ExpertAllToAll final : public ExpertExchange {
 public:
  ExpertAllToAll(const ExpertParallel& ep, Backend& be, int E, int C)
      : comm_(ep.comm),
        tp_comm_(ep.tp_size > 1 ? ep.tp_comm : nullptr),
        be_(be),
        P_(ep.size),
        El_(E / ep.size),
        C_(C) {}

  int64_t plan(const int32_t* counts, const int32_t* off,
               std::vector<int32_t>& local_offsets) override {
    const int P = P_, El = El_;
    local_offsets.assign(El + 1, 0);
    offsets_.assign(off, off + int64_t(P) * El + 1);
    runs_.clear();
    if (P == 1) {
      local_offsets = offsets_;
      R_ = local_offsets[El];
      return 0;
    }
    // How many rows each source rank sends for each of this rank's experts: exchanged through
    // a backend buffer, since a device communicator (NCCL) takes device memory only.
    std::vector<int32_t> send_counts(size_t(P) * El), recv_counts(size_t(P) * El);
    int64_t most = 0;
    for (int d = 0; d < P; ++d) {
      for (int e = 0; e < El; ++e) send_counts[size_t(d) * El + e] = counts[d * El + e];
      most = std::max<int64_t>(most, off[(d + 1) * El] - off[d * El]);
    }
    int32_t* dev = counts_.ensure_n<int32_t>(be_, 2 * send_counts.size(), "expert_parallel");
    be_.copy_h2d(dev, send_counts.data(), send_counts.size() * sizeof(int32_t));
    comm_->all_to_all(dev, dev + send_counts.size(), El, DType::I32);
    be_.copy_d2h(recv_counts.data(), dev + send_counts.size(),
                 recv_counts.size() * sizeof(int32_t));
    block_ = std::max<int64_t>(1, comm_->all_reduce_scalar(most, comm::ReduceOp::Max));
    // Grouped order: expert by expert, and within an expert source rank by source rank.
    for (int e = 0; e < El; ++e) {
      int64_t n = 0;
      for (int s = 0; s < P; ++s) n += recv_counts[size_t(s) * El + e];
      local_offsets[e + 1] = static_cast<int32_t>(local_offsets[e] + n);
    }
    R_ = local_offsets[El];
    // Source s's rows for expert e: one contiguous run in s's received block and one in the
    // grouped buffer, so each direction is P * El copies.
    for (int s = 0; s < P; ++s) {
      int64_t in_block = 0;
      for (int e = 0; e < El; ++e) {
        int64_t before = 0;  // rows of expert e from sources < s
        for (int t = 0; t < s; ++t) before += recv_counts[size_t(t) * El + e];
        const int64_t n = recv_counts[size_t(s) * El + e];
        if (n > 0) runs_.push_back({local_offsets[e] + before, int64_t(s) * block_ + in_block, n});
        in_block += n;
      }
    }
    const size_t floats = size_t(P) * block_ * C_;
    send_ = send_buf_.ensure_n<float>(be_, floats, "expert_parallel");
    recv_ = recv_buf_.ensure_n<float>(be_, floats, "expert_parallel");
    return 2 * int64_t(P) * block_ * C_;
  }

  void dispatch(const float* local, float* grouped) override {
    const int P = P_;
    const int64_t C = C_;
    if (P == 1) {
      be_.copy_d2d(grouped, local, sizeof(float) * size_t(R_) * C);
      return;
    }
    for (int d = 0; d < P; ++d) {
      const int64_t a = offsets_[d * El_], n = offsets_[(d + 1) * El_] - a;
      if (n > 0) be_.copy_d2d(send_ + d * block_ * C, local + a * C, sizeof(float) * n * C);
    }
    comm_->all_to_all(send_, recv_, block_ * C, DType::F32);
    for (const Run& r : runs_)
      be_.copy_d2d(grouped + r.grouped * C, recv_ + r.received * C, sizeof(float) * r.n * C);
  }

  void combine(const float* grouped, float* local) override {
    const int P = P_;
    const int64_t C = C_;
    if (P == 1) {
      be_.copy_d2d(local, grouped, sizeof(float) * size_t(R_) * C);
      return;
    }
    for (const Run& r : runs_)
      be_.copy_d2d(send_ + r.received * C, grouped + r.grouped * C, sizeof(float) * r.n * C);
    comm_->all_to_all(send_, recv_, block_ * C, DType::F32);
    for (int d = 0; d < P; ++d) {
      const int64_t a = offsets_[d * El_], n = offsets_[(d + 1) * El_] - a;
      if (n > 0) be_.copy_d2d(local + a * C, recv_ + d * block_ * C, sizeof(float) * n * C);
    }
  }

  // Each expert-tensor-parallel rank holds a slice of the experts' width: w2 row-parallel (its
  // output a partial sum), w1 column-parallel (its input gradient a partial sum).
  void reduce_partial(float* x, int64_t n) override {
    if (tp_comm_) tp_comm_->all_reduce(x, n, DType::F32, comm::ReduceOp::Sum);
  }

 private:
  // `n` rows at row `grouped` of the grouped buffer <-> at row `received` of the blocks [P, B, C].
  struct Run {
    int64_t grouped, received, n;
  };
  comm::Communicator* comm_;
  comm::Communicator* tp_comm_;
  Backend& be_;
  int P_, El_, C_;
  int64_t R_ = 0;
  std::vector<int32_t> offsets_;  // [E + 1] this rank's routing, expert-grouped
  int64_t block_ = 0;             // rows per rank's block in the all-to-all (P > 1)
  std::vector<Run> runs_;
  BackendBuffer counts_, send_buf_, recv_buf_;
  float* send_ = nullptr;
  float* recv_ = nullptr;
};

}  // namespace

std::unique_ptr<ExpertExchange> make_expert_exchange(const ExpertParallel& ep, Backend& be, int E,
                                                     int C) {
  return std::make_unique<ExpertAllToAll>(ep, be, E, C);
}

}  // namespace loom::parallel
