#include "parallel/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace loom::parallel {
namespace {

class ExpertAllToAll final : public ExpertExchange {
 public:
  ExpertAllToAll(const ExpertParallel& ep, int E, int C)
      : comm_(ep.comm),
        tp_comm_(ep.tp_size > 1 ? ep.tp_comm : nullptr),
        P_(ep.size),
        El_(E / ep.size),
        C_(C) {}

  int64_t plan(const int32_t* counts, const int32_t* off,
               std::vector<int32_t>& local_offsets) override {
    const int P = P_, El = El_;
    local_offsets.assign(El + 1, 0);
    offsets_.assign(off, off + int64_t(P) * El + 1);
    if (P == 1) {
      local_offsets = offsets_;
      R_ = local_offsets[El];
      return 0;
    }
    // How many rows each source rank sends for each of this rank's experts.
    std::vector<int32_t> send_counts(size_t(P) * El), recv_counts(size_t(P) * El);
    int64_t most = 0;
    for (int d = 0; d < P; ++d) {
      for (int e = 0; e < El; ++e) send_counts[size_t(d) * El + e] = counts[d * El + e];
      most = std::max<int64_t>(most, off[(d + 1) * El] - off[d * El]);
    }
    comm_->all_to_all(send_counts.data(), recv_counts.data(), El, DType::I32);
    block_ = std::max<int64_t>(1, comm_->all_reduce_scalar(most, comm::ReduceOp::Max));
    // Grouped order: expert by expert, and within an expert source rank by source rank.
    for (int e = 0; e < El; ++e) {
      int64_t n = 0;
      for (int s = 0; s < P; ++s) n += recv_counts[size_t(s) * El + e];
      local_offsets[e + 1] = static_cast<int32_t>(local_offsets[e] + n);
    }
    R_ = local_offsets[El];
    recv_pos_.assign(size_t(R_), 0);
    for (int s = 0; s < P; ++s) {
      int64_t in_block = 0;
      for (int e = 0; e < El; ++e) {
        int64_t before = 0;  // rows of expert e from sources < s
        for (int t = 0; t < s; ++t) before += recv_counts[size_t(t) * El + e];
        for (int i = 0; i < recv_counts[size_t(s) * El + e]; ++i)
          recv_pos_[local_offsets[e] + before + i] = int64_t(s) * block_ + in_block++;
      }
    }
    send_buf_.resize(size_t(P) * block_ * C_);
    recv_buf_.resize(size_t(P) * block_ * C_);
    return 2 * int64_t(P) * block_ * C_;
  }

  void dispatch(const float* local, float* grouped) override {
    const int P = P_, C = C_;
    if (P == 1) {
      std::memcpy(grouped, local, sizeof(float) * size_t(R_) * C);
      return;
    }
    for (int d = 0; d < P; ++d) {
      const int64_t a = offsets_[d * El_], n = offsets_[(d + 1) * El_] - a;
      std::memcpy(send_buf_.data() + size_t(d) * block_ * C, local + a * C, sizeof(float) * n * C);
    }
    comm_->all_to_all(send_buf_.data(), recv_buf_.data(), block_ * C, DType::F32);
    for (int64_t r = 0; r < R_; ++r)
      std::memcpy(grouped + r * C, recv_buf_.data() + recv_pos_[r] * C, sizeof(float) * C);
  }

  void combine(const float* grouped, float* local) override {
    const int P = P_, C = C_;
    if (P == 1) {
      std::memcpy(local, grouped, sizeof(float) * size_t(R_) * C);
      return;
    }
    for (int64_t r = 0; r < R_; ++r)
      std::memcpy(send_buf_.data() + recv_pos_[r] * C, grouped + r * C, sizeof(float) * C);
    comm_->all_to_all(send_buf_.data(), recv_buf_.data(), block_ * C, DType::F32);
    for (int d = 0; d < P; ++d) {
      const int64_t a = offsets_[d * El_], n = offsets_[(d + 1) * El_] - a;
      std::memcpy(local + a * C, recv_buf_.data() + size_t(d) * block_ * C, sizeof(float) * n * C);
    }
  }

  // Each expert-tensor-parallel rank holds a slice of the experts' width: w2 row-parallel (its
  // output a partial sum), w1 column-parallel (its input gradient a partial sum).
  void reduce_partial(float* x, int64_t n) override {
    if (tp_comm_) tp_comm_->all_reduce(x, n, DType::F32, comm::ReduceOp::Sum);
  }

 private:
  comm::Communicator* comm_;
  comm::Communicator* tp_comm_;
  int P_, El_, C_;
  int64_t R_ = 0;
  std::vector<int32_t> offsets_;  // [E + 1] this rank's routing, expert-grouped
  // Exchange plan (P > 1): block size (rows) and where each grouped row sits in the received
  // blocks [P, B, C].
  int64_t block_ = 0;
  std::vector<int64_t> recv_pos_;
  std::vector<float> send_buf_, recv_buf_;
};

}  // namespace

std::unique_ptr<ExpertExchange> make_expert_exchange(const ExpertParallel& ep, int E, int C) {
  return std::make_unique<ExpertAllToAll>(ep, E, C);
}

}  // namespace loom::parallel
