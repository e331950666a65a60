#include "parallel/tensor_parallel.h"

#include "core/error.h"
#include "kernels/buffer.h"
#include "parallel/expert_parallel.h"
#include "parallel/vocab_parallel.h"

namespace loom::parallel {
namespace {

// Megatron's conjugate operators over the TP communicator: without SP the residual stream is
// replicated (a row-parallel output and a column-parallel input gradient are all-reduced);
// with SP each rank holds N / size rows, gathered before a column-parallel layer and
// reduce-scattered after a row-parallel one. Buffers are the backend's; the communicator reads
// them where they are (host memory on the CPU, device memory under NCCL).
class TensorParallelEdges final : public TensorParallelOps {
 public:
  TensorParallelEdges(const TensorParallel& tp, Backend& be)
      : comm_(*tp.comm), size_(tp.size), rank_(tp.rank), sp_(tp.sequence_parallel), be_(be) {}

  int local_rows(int N) const override { return sp_ ? N / size_ : N; }
  int row0(int N) const override { return sp_ ? rank_ * (N / size_) : 0; }
  bool holds_bias() const override { return rank_ == 0; }

  void gather_rows(const ActBuf& full, int N, int C) override {
    if (!sp_) return;
    const std::vector<int64_t> counts = rows_counts(N, C);
    if (full.f32)
      comm_.all_gather(full.f32, counts, DType::F32);
    else
      comm_.all_gather(full.bf16, counts, DType::BF16);
  }

  float* reduce_rows(float* partial, int N, int C, float* out) override {
    if (!sp_) {
      comm_.all_reduce(partial, int64_t(N) * C, DType::F32, comm::ReduceOp::Sum);
      return partial;
    }
    if (!out) out = reduced_.ensure_n<float>(be_, size_t(N) * C, "activations");
    comm_.reduce_scatter(partial, out, rows_counts(N, C), DType::F32, comm::ReduceOp::Sum);
    return out;
  }

  const float* full_rows(const float* local, int N, int C) override {
    if (!sp_) return local;
    float* full = gathered_.ensure_n<float>(be_, size_t(N) * C, "activations");
    be_.copy_d2d(full + int64_t(row0(N)) * C, local, size_t(local_rows(N)) * C * sizeof(float));
    comm_.all_gather(full, rows_counts(N, C), DType::F32);
    return full;
  }

  // Under SP each rank's norm sees only its tokens: its weight gradient is a partial sum,
  // reduced over the group (into zeroed scratch first, since gradients accumulate).
  void replicated_grads(float* dw, float* db, int C,
                        const std::function<void(float*, float*)>& compute) override {
    if (!sp_) return compute(dw, db);
    float* sw = grads_.ensure_n<float>(be_, 2 * size_t(C), "scratch");
    be_.fill_bytes(sw, 0, 2 * size_t(C) * sizeof(float));
    float* sb = db ? sw + C : nullptr;
    compute(sw, sb);
    comm_.all_reduce(sw, 2 * int64_t(C), DType::F32, comm::ReduceOp::Sum);
    if (dw) be_.add_inplace(dw, sw, C);
    if (db) be_.add_inplace(db, sb, C);
  }

 private:
  std::vector<int64_t> rows_counts(int N, int C) const {
    return std::vector<int64_t>(size_t(size_), int64_t(N / size_) * C);
  }
  comm::Communicator& comm_;
  int size_, rank_;
  bool sp_;
  Backend& be_;
  BackendBuffer reduced_, gathered_, grads_;  // [N, C], [N, C], [2C]
};

std::unique_ptr<TensorParallelOps> make_edges(const TensorParallel& tp, Backend& be) {
  return std::make_unique<TensorParallelEdges>(tp, be);
}

}  // namespace

TensorParallel tensor_parallel_layout(comm::ProcessGroups& groups, bool sequence_parallel) {
  TensorParallel tp;
  tp.size = groups.tp().size();
  tp.rank = groups.tp().rank();
  tp.sequence_parallel = sequence_parallel && tp.size > 1;
  tp.comm = &groups.tp();
  return with_tensor_parallel_ops(tp);
}

TensorParallel with_tensor_parallel_ops(TensorParallel tp) {
  tp.make_ops = &make_edges;
  tp.make_vocab = &make_vocab_parallel;
  return tp;
}

ExpertParallel expert_parallel_layout(comm::ProcessGroups& groups, int etp) {
  ExpertParallel ep;
  ep.size = groups.ep().size();
  ep.rank = groups.ep().rank();
  ep.comm = &groups.ep();
  ep.make_exchange = &make_expert_exchange;
  comm::Communicator& tp = groups.tp();
  LOOM_CHECK(etp >= 1 && tp.size() % etp == 0, "parallel.etp (", etp, ") must divide parallel.tp (",
             tp.size(), "): use etp = 1 (experts replicated over ",
             "the TP group) or a divisor of tp");
  ep.tp_size = etp;
  ep.tp_rank = tp.rank() % etp;
  if (etp == tp.size()) {
    ep.tp_comm = &tp;
  } else if (etp > 1) {
    ep.tp_owner = tp.split(tp.rank() / etp, ep.tp_rank, "etp");
    ep.tp_comm = ep.tp_owner.get();
  }
  return ep;
}

std::vector<double> grad_norm_weights(const ParamSet& params, int tp_rank, int etp) {
  std::vector<double> w;
  for (const ParamInfo& p : params.infos()) {
    const bool counts = p.expert ? tp_rank < etp : p.sharded() || tp_rank == 0;
    w.push_back(counts ? 1.0 : 0.0);
  }
  return w;
}

}  // namespace loom::parallel
