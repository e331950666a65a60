#include "model/parallel_ops.h"

#include "core/error.h"
#include "model/context_parallel.h"
#include "model/decoder.h"

namespace loom {
namespace {

class SingleRank final : public TensorParallelOps {
 public:
  int local_rows(int N) const override { return N; }
  int row0(int) const override { return 0; }
  bool holds_bias() const override { return true; }
  void gather_rows(const ActBuf&, int, int) override {}
  float* reduce_rows(float* partial, int, int, float*) override { return partial; }
  const float* full_rows(const float* local, int, int) override { return local; }
  void replicated_grads(float* dw, float* db, int,
                        const std::function<void(float*, float*)>& compute) override {
    compute(dw, db);
  }
};

class WholeVocab final : public VocabOps {
 public:
  WholeVocab(Backend& be, int vocab) : be_(be), V_(vocab) {}
  void embed(float* x, const int32_t* tokens, const float* wte, int N, int C) override {
    be_.embedding_forward(x, tokens, wte, N, C, false);
  }
  void embed_backward(float* dwte, const float* d, const int32_t* tokens, int N, int C) override {
    be_.embedding_backward(dwte, d, tokens, N, C);
  }
  void cross_entropy(float* losses, float* logits, const int32_t* targets, int n, float dloss,
                     const float* weights, bool grads) override {
    be_.cross_entropy(losses, grads ? logits : nullptr, logits, targets, n, V_, dloss, weights);
  }
  bool cross_entropy_bf16(float* losses, float* logits, uint16_t* dlogit_bits,
                          const int32_t* targets, int n, float dloss, const float* weights,
                          bool grads) override {
    return be_.cross_entropy_bf16(losses, logits, dlogit_bits, targets, n, V_, dloss, weights,
                                  grads);
  }
  bool cross_entropy_from_bf16(float* losses, uint16_t* logits, const int32_t* targets, int n,
                               float dloss, const float* weights, bool grads) override {
    return be_.cross_entropy_from_bf16(losses, logits, targets, n, V_, dloss, weights, grads);
  }
  float* logits_slot(float* full, int) override { return full; }
  void gather_logits(float*, int) override {}

 private:
  Backend& be_;
  int V_;
};

class PackedAttention final : public AttentionCore {
 public:
  explicit PackedAttention(Backend& be) : be_(be) {}
  void forward(float* out, float* lse, const float* qkv, int ld, int Hq, int Hkv, int D,
               float scale, const ModelInput& in) override {
    const float* k = qkv + Hq * D;
    be_.attention_forward(out, lse, qkv, k, k + Hkv * D, ld, in.cu_seqlens, in.nseq, Hq, Hkv, D,
                          scale);
  }
  void backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                const float* lse, int ld, int Hq, int Hkv, int D, float scale,
                const ModelInput& in) override {
    const int A = Hq * D;
    const float* k = qkv + A;
    be_.attention_backward(dqkv, dqkv + A, dqkv + A + Hkv * D, dout, qkv, k, k + Hkv * D, out, lse,
                           ld, in.cu_seqlens, in.nseq, Hq, Hkv, D, scale);
  }

 private:
  Backend& be_;
};

class LocalExperts final : public ExpertExchange {
 public:
  LocalExperts(Backend& be, int E, int C) : be_(be), E_(E), C_(C) {}
  int64_t plan(const int32_t*, const int32_t* offsets, std::vector<int32_t>& local) override {
    local.assign(offsets, offsets + E_ + 1);
    R_ = local.back();
    return 0;
  }
  void dispatch(const float* local, float* grouped) override {
    be_.copy_d2d(grouped, local, sizeof(float) * size_t(R_) * C_);
  }
  void combine(const float* grouped, float* local) override {
    be_.copy_d2d(local, grouped, sizeof(float) * size_t(R_) * C_);
  }
  void reduce_partial(float*, int64_t) override {}

 private:
  Backend& be_;
  int E_, C_;
  int64_t R_ = 0;
};

class RefusingExperts final : public ExpertExchange {
 public:
  explicit RefusingExperts(const char* what) : what_(what) {}
  int64_t plan(const int32_t*, const int32_t*, std::vector<int32_t>&) override { refuse(); }
  void dispatch(const float*, float*) override { refuse(); }
  void combine(const float*, float*) override { refuse(); }
  void reduce_partial(float*, int64_t) override { refuse(); }

 private:
  [[noreturn]] void refuse() const { fail(what_); }
  const char* what_;
};

}  // namespace

std::unique_ptr<ExpertExchange> local_expert_exchange(Backend& be, int E, int C) {
  return std::make_unique<LocalExperts>(be, E, C);
}
std::unique_ptr<ExpertExchange> refusing_expert_exchange(const char* what) {
  return std::make_unique<RefusingExperts>(what);
}

std::unique_ptr<TensorParallelOps> single_rank_ops() {
  return std::make_unique<SingleRank>();
}
std::unique_ptr<VocabOps> whole_vocab_ops(Backend& be, int vocab) {
  return std::make_unique<WholeVocab>(be, vocab);
}
std::unique_ptr<AttentionCore> packed_attention(Backend& be) {
  return std::make_unique<PackedAttention>(be);
}

CpBatch CpBatch::make(const int32_t* cu_seqlens, int nseq, int cp) {
  CpBatch b;
  for (int r = 0; r < cp; ++r) b.shards.push_back(cpu::cp_shard(cu_seqlens, nseq, cp, r));
  return b;
}

}  // namespace loom
