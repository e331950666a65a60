#include "parallel/vocab_parallel.h"

#include <vector>

#include "kernels/buffer.h"

namespace loom::parallel {
namespace {

class VocabParallel final : public VocabOps {
 public:
  VocabParallel(const TensorParallel& tp, TensorParallelOps& edges, int vocab, Backend& be)
      : comm_(*tp.comm),
        edges_(edges),
        be_(be),
        size_(tp.size),
        rank_(tp.rank),
        V_(vocab / tp.size),
        v0_(tp.rank * (vocab / tp.size)) {}

  void embed(float* x, const int32_t* tokens, const float* wte, int N, int C) override {
    // All N rows of this slice's lookup, summed over the group into this rank's rows of x: in
    // place without SP (x holds all rows), reduce-scattered into x under SP.
    const bool split = edges_.local_rows(N) != N;
    float* full = split ? full_.ensure_n<float>(be_, size_t(N) * C, "activations") : x;
    be_.embedding_forward_slice(full, tokens, wte, N, C, v0_, V_);
    edges_.reduce_rows(full, N, C, x);
  }

  void embed_backward(float* dwte, const float* d, const int32_t* tokens, int N, int C) override {
    be_.embedding_backward_slice(dwte, d, tokens, N, C, v0_, V_);
  }

  void cross_entropy(float* losses, float* logits, const int32_t* targets, int n, float dloss,
                     const float* weights, bool grads) override {
    float* mx = stats_.ensure_n<float>(be_, 3 * size_t(n), "scratch");
    float* se = mx + n;
    float* tl = se + n;
    be_.cross_entropy_slice_max(mx, logits, n, V_);
    comm_.all_reduce(mx, n, DType::F32, comm::ReduceOp::Max);
    be_.cross_entropy_slice_sums(se, tl, logits, mx, targets, n, V_, v0_);
    comm_.all_reduce(se, 2 * int64_t(n), DType::F32, comm::ReduceOp::Sum);
    be_.cross_entropy_slice_finish(losses, grads ? logits : nullptr, logits, mx, se, tl, targets, n,
                                   V_, v0_, dloss, weights);
  }

  // Each rank's head writes its slice [n, V / tp] into its part of the all-gather's rank-major
  // layout; gather_logits interleaves the parts into whole rows.
  float* logits_slot(float* full, int n) override {
    const int64_t part = int64_t(n) * V_;
    return parts_.ensure_n<float>(be_, size_t(part) * size_, "scratch") + rank_ * part;
  }
  void gather_logits(float* full, int n) override {
    const int64_t part = int64_t(n) * V_;
    float* parts = parts_.as<float>();
    comm_.all_gather(parts, std::vector<int64_t>(size_t(size_), part), DType::F32);
    const size_t slice = size_t(V_) * sizeof(float);
    for (int r = 0; r < size_; ++r)
      be_.copy_2d(full + int64_t(r) * V_, size_t(V_) * size_ * sizeof(float), parts + r * part,
                  slice, slice, size_t(n));
  }

 private:
  comm::Communicator& comm_;
  TensorParallelOps& edges_;
  Backend& be_;
  int size_, rank_, V_, v0_;
  BackendBuffer full_, stats_, parts_;
};

}  // namespace

std::unique_ptr<VocabOps> make_vocab_parallel(const TensorParallel& tp, TensorParallelOps& edges,
                                              int vocab, Backend& be) {
  return std::make_unique<VocabParallel>(tp, edges, vocab, be);
}

}  // namespace loom::parallel
