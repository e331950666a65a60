// The op interface. Every op is a plain function over raw buffers of one device (llm.c style),
// grouped in a Backend so a CUDA implementation can provide the same ops over device pointers.
// Conventions, for every backward op:
//   - gradients of parameters (dweight, dbias, dtable) are ACCUMULATED (+=), because a
//     parameter's gradient sums over micro-batches and, with tied weights, over uses;
//   - gradients of inputs (dinp) are WRITTEN (=); the caller adds branches together.
// Shapes are row-major. N = number of tokens (rows), C = channels. Nullable pointers say so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/paged_kv.h"
#include "kernels/rope_scaling.h"

namespace loom {

struct Backend {
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;
  // Throws: `op` is not implemented on this backend (the defaults of optional ops).
  [[noreturn]] void missing_op(const char* op) const {
    fail(op, " is not implemented on the ", name(), " backend");
  }

  // ---- Memory. A buffer lives on the backend's device (host memory on the CPU backend, device
  // memory on CUDA): callers pass it to ops and to these copies, and never dereference it on
  // the host unless host_accessible(). Copies and fills are ordered with the ops (the CUDA
  // backend's stream); copy_d2h returns once the bytes are on the host.
  static constexpr size_t kAlign = 256;  // every buffer: cuBLASLt and vector loads like it
  // `bytes` (may be 0) aligned to kAlign, contents undefined. `cls` names the buffer class
  // ("activations", "scratch", ...) for memory_report(); it must outlive the buffer (a string
  // literal). Throws loom::Error naming the class and the size when the device is out of memory.
  virtual void* alloc(size_t bytes, const char* cls) = 0;
  // alloc, zero-filled. The CPU backend maps fresh anonymous pages, which read as zeros and
  // take no memory until written (a ZeRO-3 rank touches only its part of the parameters);
  // other backends fill with fill_bytes.
  virtual void* alloc_zeroed(size_t bytes, const char* cls) {
    void* p = alloc(bytes, cls);
    try {
      fill_bytes(p, 0, bytes);
    } catch (...) {
      free(p);
      throw;
    }
    return p;
  }
  virtual void free(void* p) = 0;  // a pointer alloc or alloc_zeroed returned, or nullptr
  virtual void copy_h2d(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_d2h(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_d2d(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_bytes(void* dst, int byte, size_t bytes) = 0;
  // Waits for every op issued so far (and throws any input error the device recorded).
  virtual void sync() = 0;
  // Whether the host may read and write this backend's buffers directly (the CPU backend): the
  // paths not yet moved onto the Backend (checkpoint views, the trainer's host loops) require
  // it.
  virtual bool host_accessible() const { return false; }
  // Bytes held and peak bytes per buffer class, one line each.
  virtual std::string memory_report() const = 0;

  // C[M,N] = alpha * op(A) op(B) + beta * C, row-major; op(A) is [M,K], op(B) is [K,N].
  virtual void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc) = 0;
  // `batch` independent GEMMs with element strides between consecutive matrices.
  virtual void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                            const float* A, int lda, int64_t stride_a, const float* B, int ldb,
                            int64_t stride_b, float beta, float* C, int ldc, int64_t stride_c,
                            int batch) = 0;

  // Linear layer: out[N,OC] = inp[N,IC] * weight[OC,IC]^T + bias[OC] (bias nullable).
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int IC, int OC) = 0;
  // dinp[N,IC] = dout * weight (dinp nullable: skipped); dweight += dout^T inp; dbias += sum dout.
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int IC, int OC) = 0;

  // out[i,:] (=, or += if accumulate) table[ids[i],:]. ids must lie in [0, V).
  virtual void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                                 bool accumulate) = 0;
  // dtable[ids[i],:] += dout[i,:].
  virtual void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N,
                                  int C) = 0;

  // LayerNorm over the last dim; saves mean[N], rstd[N] for backward. bias nullable.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C,
                                 float eps) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;

  // RMSNorm: out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps); saves rstd[N].
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                               int N, int C, float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                const float* weight, const float* rstd, int N, int C) = 0;

  // GeLU, tanh approximation (as GPT-2). n elements.
  virtual void gelu_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  // Optional fused GeLU passes for bf16-stored inputs (the Decoder's bf16 storage): out =
  // bf16(gelu(x)), x = in32 when given, else in16 widened; backward dinp = round_bf16(gelu'(x)
  // * dout) with its bits also in dinp_bits when given, dout rounded to bf16 in place first
  // when round_dout. false (the default): not provided, the caller runs the separate passes.
  virtual bool gelu_forward_bf16(uint16_t* out, const float* in32, const uint16_t* in16,
                                 int64_t n) {
    (void)out, (void)in32, (void)in16, (void)n;
    return false;
  }
  virtual bool gelu_backward_bf16(float* dinp, uint16_t* dinp_bits, const uint16_t* in16,
                                  float* dout, bool round_dout, int64_t n) {
    (void)dinp, (void)dinp_bits, (void)in16, (void)dout, (void)round_dout, (void)n;
    return false;
  }

  // SwiGLU: inp[N, 2F] holds [gate | up] per row; out[N,F] = silu(gate) * up.
  virtual void swiglu_forward(float* out, const float* inp, int N, int F) = 0;
  virtual void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) = 0;
  // ---- Gemma's ops (model.geglu, model.attn_softcap, model.final_softcap, a windowed layer of
  // model.window_pattern). A backend without them says so (has_gemma_ops); these defaults
  // throw naming the op. GeGLU: out[N, F] = gelu_tanh(gate) * up over rows [gate | up].
  virtual bool has_gemma_ops() const { return false; }
  virtual void geglu_forward(float* out, const float* inp, int N, int F) {
    (void)out, (void)inp, (void)N, (void)F;
    missing_op("geglu_forward");
  }
  virtual void geglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
    (void)dinp, (void)inp, (void)dout, (void)N, (void)F;
    missing_op("geglu_backward");
  }
  // x = cap * tanh(x / cap) in place; backward: d *= 1 - (y / cap)^2 from the capped y.
  virtual void softcap_forward(float* x, int64_t n, float cap) {
    (void)x, (void)n, (void)cap;
    missing_op("softcap_forward");
  }
  virtual void softcap_backward(float* d, const float* y, int64_t n, float cap) {
    (void)d, (void)y, (void)n, (void)cap;
    missing_op("softcap_backward");
  }
  // attention_forward / attention_backward's contract with a sliding window (window > 0: the
  // last `window` positions of the sequence, the query's own included) and soft-capped scores
  // (softcap > 0: softcap * tanh(scale * q.k / softcap)).
  virtual void attention_variant_forward(float* out, float* lse, const float* q, const float* k,
                                         const float* v, int ld, const int32_t* cu_seqlens,
                                         int nseq, int Hq, int Hkv, int D, float scale, int window,
                                         float softcap) {
    (void)out, (void)lse, (void)q, (void)k, (void)v, (void)ld, (void)cu_seqlens, (void)nseq,
        (void)Hq, (void)Hkv, (void)D, (void)scale, (void)window, (void)softcap;
    missing_op("attention_variant_forward");
  }
  virtual void attention_variant_backward(float* dq, float* dk, float* dv, const float* dout,
                                          const float* q, const float* k, const float* v,
                                          const float* out, const float* lse, int ld,
                                          const int32_t* cu_seqlens, int nseq, int Hq, int Hkv,
                                          int D, float scale, int window, float softcap) {
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse,
        (void)ld, (void)cu_seqlens, (void)nseq, (void)Hq, (void)Hkv, (void)D, (void)scale,
        (void)window, (void)softcap;
    missing_op("attention_variant_backward");
  }

  // Rotary embedding, rotate-half convention (Hugging Face Llama): within each head of D dims,
  // pairs (j, j + D/2) rotate by angle pos * theta^(-2j/D). x has H heads per token and a row
  // stride of `ld` elements; rotated in place. Backward rotates by the negative angle.
  virtual void rope_forward(float* x, const int32_t* pos, int N, int H, int D, int ld,
                            float theta) = 0;
  virtual void rope_backward(float* dx, const int32_t* pos, int N, int H, int D, int ld,
                             float theta) = 0;
  // The same with the frequencies scaled (rope_scaling.h). The default serves only unscaled
  // RoPE, so a backend without the scaled kernel refuses such a model rather than rotating by
  // the wrong angles.
  virtual void rope_forward_scaled(float* x, const int32_t* pos, int N, int H, int D, int ld,
                                   float theta, const RopeScaling& s) {
    LOOM_CHECK(!s.enabled(), name(), " backend: RoPE scaling (llama3) is not implemented");
    rope_forward(x, pos, N, H, D, ld, theta);
  }
  virtual void rope_backward_scaled(float* dx, const int32_t* pos, int N, int H, int D, int ld,
                                    float theta, const RopeScaling& s) {
    LOOM_CHECK(!s.enabled(), name(), " backend: RoPE scaling (llama3) is not implemented");
    rope_backward(dx, pos, N, H, D, ld, theta);
  }

  // out = a + b; acc += x.
  virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;
  virtual void add_inplace(float* acc, const float* x, int64_t n) = 0;
  virtual void scale_inplace(float* x, float s, int64_t n) = 0;
  // A dropout mask kept as bits: out[n, c] = x[n, c] * scale where bit c of row n is set, else
  // 0, for N rows of C columns; row n's bits are words[n * ceil(C / 64) ...], bit c % 64 of word
  // c / 64. out == x allowed. (LoRA dropout: the mask is drawn on the host, the bits uploaded.)
  virtual void apply_bit_mask(float* out, const float* x, const uint64_t* bits, int N, int C,
                              float scale) = 0;

  // Row softmax over `cols`; backward: dinp = out * (dout - sum(dout * out)).
  virtual void softmax_forward(float* out, const float* inp, int rows, int cols) = 0;
  virtual void softmax_backward(float* dinp, const float* out, const float* dout, int rows,
                                int cols) = 0;

  // Fused softmax + cross-entropy over a vocabulary of V for N rows of logits. losses[i] =
  // -log softmax(logits[i])[targets[i]]; then, if dlogits is non-null, dlogits (which may alias
  // logits) = (softmax - onehot) * dloss * weights[i] (weights nullable: 1 for every row; a
  // weight may be negative, as DPO's and GRPO's are). Rows with target < 0 are ignored (loss 0,
  // grad 0). losses[i] is unweighted: -losses[i] is the row's log-probability of its target.
  virtual void cross_entropy(float* losses, float* dlogits, const float* logits,
                             const int32_t* targets, int N, int V, float dloss,
                             const float* weights) = 0;
  // Optional, for the bf16 policy's head: logits rounded to bf16 in place, then cross_entropy
  // with the gradient (with grads) replacing them, rounded to bf16, its bits also in
  // dlogit_bits when given: the roundings done in the same pass. false (the default): not
  // provided, the caller rounds and calls cross_entropy.
  virtual bool cross_entropy_bf16(float* losses, float* logits, uint16_t* dlogit_bits,
                                  const int32_t* targets, int N, int V, float dloss,
                                  const float* weights, bool grads) {
    (void)losses, (void)logits, (void)dlogit_bits, (void)targets, (void)N, (void)V, (void)dloss,
        (void)weights, (void)grads;
    return false;
  }
  // Optional, for the bf16 head whose GEMM writes its logits as bf16 bits (GemmRecipe::
  // bf16_outputs): cross_entropy on those values, the gradient's bf16 bits (round to nearest
  // even) replacing the logits in place with grads. N = 0 only answers whether it is provided.
  // false (the default): not provided (nothing touched); the caller keeps fp32 logits.
  virtual bool cross_entropy_from_bf16(float* losses, uint16_t* logits, const int32_t* targets,
                                       int N, int V, float dloss, const float* weights,
                                       bool grads) {
    (void)losses, (void)logits, (void)targets, (void)N, (void)V, (void)dloss, (void)weights,
        (void)grads;
    return false;
  }

  // Causal attention, tile by tile with an online softmax (memory linear in sequence length).
  // Tokens of `nseq` sequences are concatenated; sequence s spans [cu_seqlens[s],
  // cu_seqlens[s+1]) and attends only within itself (packed documents). q has Hq heads, k and v
  // Hkv heads (Hq % Hkv == 0, grouped-query), each of D dims; q, k, v rows are `ld` elements
  // apart (they usually sit inside one fused QKV row). out[N, Hq*D] contiguous; lse[N, Hq] saves
  // the log-sum-exp of each row for backward.
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, int ld, const int32_t* cu_seqlens, int nseq,
                                 int Hq, int Hkv, int D, float scale) = 0;
  // Writes dq, dk, dv (same strided layout as q, k, v).
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v, const float* out,
                                  const float* lse, int ld, const int32_t* cu_seqlens, int nseq,
                                  int Hq, int Hkv, int D, float scale) = 0;

  // AdamW with decoupled weight decay on fp32 master params; grads are multiplied by
  // grad_scale first (unscaling / clipping). `step` is 1-based, for bias correction.
  virtual void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                     int64_t step) = 0;

  // Reductions used by clipping and overflow checks.
  virtual double sum_squares(const float* x, int64_t n) = 0;
  // sum over i of w[i] * x[i] (w nullable: 1 everywhere), in double, returned to the host (the
  // loss sum of a micro-batch). The CPU backend adds in index order, so the sum is
  // bit-reproducible; every backend's order is fixed.
  virtual double weighted_sum(const float* x, const float* w, int64_t n) = 0;
  virtual bool all_finite(const float* x, int64_t n) = 0;

  // ---- Tensor-parallel pieces (parallel/vocab_parallel.h, forward_logits): ops over a slice
  // [v0, v0 + V) of the vocabulary, held by one rank of the tensor-parallel group, so that the
  // vocabulary-parallel embedding and cross-entropy run on the device between collectives.
  // out[i,:] = table[ids[i] - v0,:] for ids in the slice, 0 for the others (the sum over the
  // slices is the lookup).
  virtual void embedding_forward_slice(float* out, const int32_t* ids, const float* table, int N,
                                       int C, int v0, int V) = 0;
  // dtable[ids[i] - v0,:] += dout[i,:] for ids in the slice, rows in order (as
  // embedding_backward).
  virtual void embedding_backward_slice(float* dtable, const float* dout, const int32_t* ids, int N,
                                        int C, int v0, int V) = 0;
  // Cross-entropy over logits [N, V] of the slice, in three steps around two all-reduces of
  // three numbers per row (docs/parallel.md): mx[i] = max of row i; then (after a max-reduce)
  // se[i] = sum_j exp(logits[i,j] - mx[i]) (in double) and tl[i] = the target's logit where
  // the target is in the slice, else 0; then (after a sum-reduce of se and tl) losses[i] =
  // log se[i] + mx[i] - tl[i] and, if dlogits is non-null (it may alias logits), this slice of
  // (softmax - onehot) * dloss * weights[i] (weights nullable). Rows with target < 0: loss 0,
  // gradient 0.
  virtual void cross_entropy_slice_max(float* mx, const float* logits, int N, int V) = 0;
  virtual void cross_entropy_slice_sums(float* se, float* tl, const float* logits, const float* mx,
                                        const int32_t* targets, int N, int V, int v0) = 0;
  virtual void cross_entropy_slice_finish(float* losses, float* dlogits, const float* logits,
                                          const float* mx, const float* se, const float* tl,
                                          const int32_t* targets, int N, int V, int v0, float dloss,
                                          const float* weights) = 0;
  // `rows` rows of `row_bytes` from src to dst, rows `spitch` / `dpitch` bytes apart (as
  // cudaMemcpy2D): slices of rows interleaved into whole rows. dst and src are buffers of this
  // backend.
  virtual void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t row_bytes,
                       size_t rows) = 0;

  // ---- Mixture of experts and ring attention (model/moe_layer.h, parallel/ring_attention.h): the
  // ops of kernels/cpu/moe.h, attention_block.h and attention_merge.h over backend buffers, so
  // both run on the device. Index arrays (topk_idx, the routing plan) are int32 buffers of this
  // backend.
  // Router: scores[N,E] = softmax or (sigmoid) sigmoid of logits[N,E]; topk_idx[N,k] the k
  // largest in descending order (ties: lower index first); topk_w[N,k] their scores, divided by
  // their sum when renormalize. Backward: dlogits (written) from dtopk_w and dscores (nullable).
  virtual void moe_router_forward(float* scores, int32_t* topk_idx, float* topk_w,
                                  const float* logits, int N, int E, int k, bool sigmoid,
                                  bool renormalize) = 0;
  virtual void moe_router_backward(float* dlogits, const float* dtopk_w, const float* dscores,
                                   const float* scores, const int32_t* topk_idx, int N, int E,
                                   int k, bool sigmoid, bool renormalize) = 0;
  // The load-balancing loss of N tokens (returned to the host, as weighted_sum) and, when
  // dscores is non-null, its gradient added there (cpu::moe_aux_loss).
  virtual double moe_aux_loss(float* dscores, const float* scores, const int32_t* topk_idx, int N,
                              int E, int k, float coeff, float dloss) = 0;
  // stats[2E+1] = [assignments per expert (before dropping), sum over tokens of each expert's
  // score (added in token order in double, then rounded), N]: the aux loss's statistics, to be
  // summed over a token group (context parallelism) before the loss is formed.
  virtual void moe_expert_stats(float* stats, const float* scores, const int32_t* topk_idx, int N,
                                int E, int k) = 0;
  // x[t, :] += row[:] for t < N (a per-expert gradient onto every token's scores).
  virtual void add_row_broadcast(float* x, const float* row, int N, int C) = 0;
  // The routing plan of cpu::moe_plan_routing in one int32 buffer of moe_plan_ints(N, E, k):
  // assigned [E] (before dropping), counts [E] (kept), offsets [E+1], row_of [N*k] (-1:
  // dropped), token_of [N*k] (the first offsets[E] are used). capacity < 0: dropless. An expert
  // index outside [0, E) is an input error (thrown here, or by the next sync on a device).
  virtual void moe_plan_routing(int32_t* plan, const int32_t* topk_idx, int N, int E, int k,
                                int capacity) = 0;
  static int64_t moe_plan_ints(int N, int E, int k) {
    return 3 * int64_t(E) + 1 + 2 * int64_t(N) * k;
  }
  // out[rows,C] = x[token_of[r],:]; backward: dx[t,:] (written) = sum of its kept rows' dout.
  virtual void moe_permute(float* out, const float* x, const int32_t* token_of, int rows,
                           int C) = 0;
  virtual void moe_permute_backward(float* dx, const float* dout, const int32_t* row_of, int N,
                                    int k, int C) = 0;
  // y[N,C] (written) = sum over kept slots of topk_w * expert_out[row]; backward writes
  // dexpert_out[rows,C] and dtopk_w[N,k] (0 where dropped).
  virtual void moe_unpermute(float* y, const float* expert_out, const float* topk_w,
                             const int32_t* row_of, int N, int k, int C) = 0;
  virtual void moe_unpermute_backward(float* dexpert_out, float* dtopk_w, const float* dy,
                                      const float* expert_out, const float* topk_w,
                                      const int32_t* row_of, int N, int k, int C) = 0;
  // Full (unmasked) attention of nq queries against nk keys (cpu::attention_block_forward) and
  // its backward, which ADDS into dq, dk, dv given the merged out and lse.
  virtual void attention_block_forward(float* out, float* lse, const float* q, int ldq,
                                       const float* k, const float* v, int ldk, int nq, int nk,
                                       int Hq, int Hkv, int D, float scale) = 0;
  virtual void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                        const float* out, const float* lse, const float* q, int ldq,
                                        const float* k, const float* v, int ldk, int nq, int nk,
                                        int Hq, int Hkv, int D, float scale) = 0;
  // Exact merge of two partial attention results by their log-sum-exps (cpu::attention_merge;
  // out/lse may alias out_a/lse_a).
  virtual void attention_merge(float* out, float* lse, const float* out_a, const float* lse_a,
                               const float* out_b, const float* lse_b, int N, int H, int D) = 0;
  // dst[i, :cols] += src[i, :cols] for rows rows of strides ldd and lds (elements).
  virtual void add_2d(float* dst, int ldd, const float* src, int lds, int rows, int cols) = 0;

  // Storage in the precision policy's types. round_to: x in place to the precision of t (BF16,
  // F16, F8E4M3, F8E5M2; F32 leaves it), as core's round_to, and when `store` is not null the
  // same values also written there in type t (one pass where the backend can). convert: dst
  // (type dt) <- src (type st), elementwise, rounding to nearest even.
  virtual void round_to(DType t, float* x, int64_t n, void* store) = 0;
  virtual void convert(void* dst, DType dt, const void* src, DType st, int64_t n) = 0;

  // ---- Delayed fp8 scaling's bookkeeping (precision/device_fp8_scaling.h), on the device so a
  // step needs no host round trip: every pointer is a buffer of this backend, each scalar one
  // fp32. The arithmetic is the CPU recipe's (Fp8Linear in precision/fp8_recipes.h).
  // *amax = max |x[i]| over n elements, compared as bit patterns (a NaN wins, as cpu::fp8_amax).
  virtual void fp8_amax(const float* x, int64_t n, float* amax) = 0;
  // *pending = max(*pending, *amax) when *amax is finite (a step whose tensor is not finite is
  // skipped by the trainer, so its amax must not enter the history). A pending amax is -1 while
  // nothing was recorded since the last step.
  virtual void fp8_record_amax(float* pending, const float* amax) = 0;
  // One tensor's history step, when *pending >= 0 (something was recorded; else nothing
  // happens): with a = *amax (the pending amax max-reduced over ranks; it may be `pending`),
  // history[pos] = a for pos_count = {pos, count} (int32), pos advances modulo len and count
  // up to len; amax = a (most_recent) or the history's max (len entries, zeros where unused);
  // *scale = fmt_max / amax / 2^margin for e4m3 (448) or e5m2 (57344), unchanged when amax is 0
  // or not finite, fp32's max when the quotient overflows; then *pending = -1.
  virtual void fp8_roll_history(float* history, int len, int32_t* pos_count, float* pending,
                                const float* amax, float* scale, bool e5m2, int margin,
                                bool most_recent) = 0;

  // ---- Serving over a paged KV cache (infer/model_runner.cpp; kernels/cpu/paged_attention.h
  // says what each computes): `cache` holds one layer's pools and `chunks` is a PagedChunkTable
  // of `nchunks` chunks and `rows` rows in an int32 buffer of this backend (kernels/paged_kv.h).
  // A block index outside [0, cache.num_blocks), or a block table too short for its chunk, is an
  // input error (thrown here, or by the next sync on a device).
  // Writes the chunks' new keys and values (rows of n_kv_head * head_dim floats, `ld` apart;
  // rounded to bf16 when the pool is bf16) into their slots.
  virtual void paged_kv_write(const PagedKvBuffers& cache, const float* k_new, const float* v_new,
                              int ld, const int32_t* chunks, int nchunks, int rows) = 0;
  // out[rows, Hq * D] = causal attention of each new query (rows `ldq` apart, Hq heads) over
  // positions [0, start_pos + i] of its sequence, read from the cache (written first), online
  // softmax in fp32, grouped-query heads (Hq % n_kv_head == 0).
  virtual void paged_attention(float* out, const float* q, int ldq, const PagedKvBuffers& cache,
                               const int32_t* chunks, int nchunks, int rows, int Hq,
                               float scale) = 0;
  // paged_attention with a sliding window and soft-capped scores (as attention_variant_forward).
  virtual void paged_attention_variant(float* out, const float* q, int ldq,
                                       const PagedKvBuffers& cache, const int32_t* chunks,
                                       int nchunks, int rows, int Hq, float scale, int window,
                                       float softcap) {
    (void)out, (void)q, (void)ldq, (void)cache, (void)chunks, (void)nchunks, (void)rows, (void)Hq,
        (void)scale, (void)window, (void)softcap;
    missing_op("paged_attention_variant");
  }

  // ---- bf16 policy: the optimizer writes the model's working copies. adamw on the fp32
  // master, then model[i] = round_bf16(master[i]) and, when model_bf16 is not null, its bf16
  // bits there (what the bf16 GEMMs read). The CPU backend does it in one pass; this default
  // is adamw, copy_d2d and round_to.
  virtual void adamw_to_bf16(float* master, const float* grad, float* m, float* v, int64_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             float grad_scale, int64_t step, float* model, uint16_t* model_bf16) {
    adamw(master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    copy_d2d(model, master, size_t(n) * sizeof(float));
    round_to(DType::BF16, model, n, model_bf16);
  }
};

// The CPU backend (OpenBLAS + OpenMP). One instance, stateless.
Backend& cpu_backend();

// Sets OpenMP and BLAS thread counts (0 = leave the defaults).
void set_num_threads(int n);
int num_threads();

}  // namespace loom
