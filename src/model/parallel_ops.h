// What the model calls where a parallel layout needs communication, without knowing the
// layout (docs/parallel.md, "Where parallelism lives"). Each interface has a one-process
// implementation here (every edge the identity, the plain ops); parallel/ implements the
// tensor-parallel ones (parallel/tensor_parallel.cpp, parallel/vocab_parallel.cpp) and hands
// them to the Decoder through TensorParallel's factories, so the model body reads as
// single-process code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/linear.h"

namespace loom {

struct ModelInput;

// The tensor-parallel group's communication at the edges of column- and row-parallel layers,
// and the token split of sequence parallelism: under SP each rank holds rows
// [row0(N), row0(N) + local_rows(N)) of the residual stream; without it, all N.
class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;
  virtual int local_rows(int N) const = 0;
  virtual int row0(int N) const = 0;
  // Whether this rank adds a row-parallel layer's bias (one rank does, so the sum holds it once).
  virtual bool holds_bias() const = 0;
  // `full` [N, C] holds this rank's rows at row0: gathered from every rank in place (SP; the
  // identity otherwise). Typed: bf16 storage is gathered as stored.
  virtual void gather_rows(const ActBuf& full, int N, int C) = 0;
  // The sum over the group of a partial [N, C]; returns this rank's rows of it: `partial` itself
  // (all-reduced in place), or, under SP, `out` (reduce-scattered; null: scratch of these ops,
  // valid until the next reduce_rows).
  virtual float* reduce_rows(float* partial, int N, int C, float* out = nullptr) = 0;
  // All N rows of a [N, C] of which this rank holds its rows `local`: `local` itself, or under
  // SP gathered into scratch of these ops (valid until the next full_rows).
  virtual const float* full_rows(const float* local, int N, int C) = 0;
  // The gradients (dw, db nullable) of a parameter replicated over the group whose use sees only
  // this rank's rows (the norms under SP): `compute(gw, gb)` accumulates into what it is given;
  // under SP that is zeroed scratch then summed over the group into dw/db, otherwise dw/db.
  virtual void replicated_grads(float* dw, float* db, int C,
                                const std::function<void(float* gw, float* gb)>& compute) = 0;
};

// The embedding and the output head's loss over the vocabulary: whole, or sliced over the
// tensor-parallel group (parallel/vocab_parallel.h).
class VocabOps {
 public:
  virtual ~VocabOps() = default;
  // x [local_rows(N), C] = this rank's rows of the token embedding of tokens[N].
  virtual void embed(float* x, const int32_t* tokens, const float* wte, int N, int C) = 0;
  // dwte += the lookup's gradient from d [N, C] (all rows).
  virtual void embed_backward(float* dwte, const float* d, const int32_t* tokens, int N, int C) = 0;
  // The fused softmax cross-entropy over n rows of this rank's logits (Backend::cross_entropy's
  // contract; with grads the gradient replaces the logits in place).
  virtual void cross_entropy(float* losses, float* logits, const int32_t* targets, int n,
                             float dloss, const float* weights, bool grads) = 0;
  // The same on logits rounded to bf16 first, the gradient rounded to bf16 and its bits also
  // in dlogit_bits when given (Backend::cross_entropy_bf16), where this rank's vocabulary is
  // whole and the backend fuses it; false: not done, the caller rounds and calls the above.
  virtual bool cross_entropy_bf16(float* losses, float* logits, uint16_t* dlogit_bits,
                                  const int32_t* targets, int n, float dloss, const float* weights,
                                  bool grads) {
    (void)losses, (void)logits, (void)dlogit_bits, (void)targets, (void)n, (void)dloss,
        (void)weights, (void)grads;
    return false;
  }
  // The same on logits the head's GEMM wrote as bf16 bits, the gradient's bits replacing them
  // (Backend::cross_entropy_from_bf16), where this rank's vocabulary is whole and the backend
  // provides it; n = 0 only answers whether it would. false: not done, nothing touched.
  virtual bool cross_entropy_from_bf16(float* losses, uint16_t* logits, const int32_t* targets,
                                       int n, float dloss, const float* weights, bool grads) {
    (void)losses, (void)logits, (void)targets, (void)n, (void)dloss, (void)weights, (void)grads;
    return false;
  }
  // Logits of n rows for the caller: where this rank's head writes its [n, slice] (inside
  // `full` [n, vocab] with one rank), then gather_logits fills `full` from every rank's slice.
  virtual float* logits_slot(float* full, int n) = 0;
  virtual void gather_logits(float* full, int n) = 0;
};

// A layer's attention core over the micro-batch: packed causal attention (one process), or
// ring attention over a context-parallel group (parallel/ring_attention.h).
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // qkv [N, ld] (Hq query, Hkv key, Hkv value heads of D dims) -> out [N, Hq * D], lse [N, Hq].
  virtual void forward(float* out, float* lse, const float* qkv, int ld, int Hq, int Hkv, int D,
                       float scale, const ModelInput& in) = 0;
  // dqkv [N, ld] written from dout; qkv, out, lse as forward had them.
  virtual void backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int ld, int Hq, int Hkv, int D, float scale,
                        const ModelInput& in) = 0;
  // Per-sequence sums over this rank's rows (host doubles, e.g. log-probabilities) made whole:
  // under context parallelism each rank holds chunks of every sequence, so the group sums
  // them; packed attention holds whole sequences and leaves them.
  virtual void sum_sequence_parts(double* sums, int nseq) {}
};

// Expert parallelism's exchange of routed rows (MoeLayer calls it between routing and the
// experts' MLPs, and back): with P ranks each holding E / P experts, the rows this rank routed
// to each rank's experts go there and come back; with expert tensor parallelism the experts'
// partial outputs and input gradients are summed over the ETP group. One process: a copy.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // From this rank's routing (counts [E] rows per expert, offsets [E + 1], expert-grouped),
  // the layout of the rows this rank's experts receive: local_offsets [El + 1]. Returns the
  // floats this rank will send in one dispatch + combine (statistics).
  virtual int64_t plan(const int32_t* counts, const int32_t* offsets,
                       std::vector<int32_t>& local_offsets) = 0;
  // [rows, C] in routing order -> [R, C] grouped by this rank's experts, and back (backend
  // buffers: copies are Backend ops, the all-to-alls run on the backend's memory).
  virtual void dispatch(const float* local, float* grouped) = 0;
  virtual void combine(const float* grouped, float* local) = 0;
  // x[n] summed over the expert-tensor-parallel group (identity without ETP).
  virtual void reduce_partial(float* x, int64_t n) = 0;
};

// The one-process implementations.
std::unique_ptr<TensorParallelOps> single_rank_ops();
std::unique_ptr<VocabOps> whole_vocab_ops(Backend& be, int vocab);
std::unique_ptr<AttentionCore> packed_attention(Backend& be);
// Every expert local: the exchange is a copy of R rows of C floats (Backend::copy_d2d).
std::unique_ptr<ExpertExchange> local_expert_exchange(Backend& be, int E, int C);
// For a layout built without its communication (size > 1): every call throws naming `what`.
std::unique_ptr<ExpertExchange> refusing_expert_exchange(const char* what);

}  // namespace loom
