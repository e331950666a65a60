// CPU implementations of the Backend ops (OpenBLAS + OpenMP + compiler SIMD).
// Semantics of each op: see kernels/backend.h.
#pragma once

#include <cstdint>

#include "kernels/rope_scaling.h"

namespace loom::cpu {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta,
                  float* C, int ldc, int64_t stride_c, int batch);
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);
void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                       bool accumulate);
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
// GeLU on bf16-stored values, fused with the conversions (gelu_bf16.cpp): out = bf16(gelu(x))
// with x = in32 when given, else widened from in16; dinp = round_bf16(gelu'(x) * dout), its bits
// also in dinp_bits when given, with dout rounded to bf16 in place first when round_dout.
void gelu_forward_bf16(uint16_t* out, const float* in32, const uint16_t* in16, int64_t n);
void gelu_backward_bf16(float* dinp, uint16_t* dinp_bits, const uint16_t* in16, float* dout,
                        bool round_dout, int64_t n);
void swiglu_forward(float* out, const float* inp, int N, int F);
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F);
// GeGLU (Gemma): out[N, F] = gelu_tanh(gate) * up over rows [gate | up] of 2F.
void geglu_forward(float* out, const float* inp, int N, int F);
void geglu_backward(float* dinp, const float* inp, const float* dout, int N, int F);
// Soft-capping: x = cap * tanh(x / cap) in place; its backward d *= 1 - (y / cap)^2 from the
// capped values y.
void softcap_forward(float* x, int64_t n, float cap);
void softcap_backward(float* d, const float* y, int64_t n, float cap);
void rope_forward(float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
                  const RopeScaling& scaling = {});
void rope_backward(float* dx, const int32_t* pos, int N, int H, int D, int ld, float theta,
                   const RopeScaling& scaling = {});
void add(float* out, const float* a, const float* b, int64_t n);
void add_inplace(float* acc, const float* x, int64_t n);
void scale_inplace(float* x, float s, int64_t n);
// Every row of out [rows, cols] set to row (a bias seeding a GEMM output), over the team.
void broadcast_rows(float* out, const float* row, int rows, int cols);
void softmax_forward(float* out, const float* inp, int rows, int cols);
void softmax_backward(float* dinp, const float* out, const float* dout, int rows, int cols);
void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                   int N, int V, float dloss, const float* weights = nullptr);
// cross_entropy on logits rounded to bf16 in place first, the gradient (with grads) replacing
// them rounded to bf16, its bits also in dlogit_bits when given; row by row, in cache.
void cross_entropy_bf16(float* losses, float* logits, uint16_t* dlogit_bits, const int32_t* targets,
                        int N, int V, float dloss, const float* weights, bool grads);
// cross_entropy on logits held as bf16 bits [N, V]; with grads the gradient's bf16 bits
// (rounded to nearest even) replace them in place. Row by row, in cache.
void cross_entropy_from_bf16(float* losses, uint16_t* logits, const int32_t* targets, int N, int V,
                             float dloss, const float* weights, bool grads);
// Vocabulary-slice ops (Backend's tensor-parallel block; vocab_slice.cpp).
void embedding_forward_slice(float* out, const int32_t* ids, const float* table, int N, int C,
                             int v0, int V);
void embedding_backward_slice(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                              int v0, int V);
void cross_entropy_slice_max(float* mx, const float* logits, int N, int V);
void cross_entropy_slice_sums(float* se, float* tl, const float* logits, const float* mx,
                              const int32_t* targets, int N, int V, int v0);
void cross_entropy_slice_finish(float* losses, float* dlogits, const float* logits, const float* mx,
                                const float* se, const float* tl, const int32_t* targets, int N,
                                int V, int v0, float dloss, const float* weights);
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int ld, const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D,
                       float scale);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse, int ld,
                        const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D, float scale);
// Causal attention with a sliding window and soft-capped scores (attention_variant.cpp).
void attention_variant_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, int ld, const int32_t* cu_seqlens, int nseq, int Hq,
                               int Hkv, int D, float scale, int window, float softcap);
void attention_variant_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                const float* k, const float* v, const float* out, const float* lse,
                                int ld, const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D,
                                float scale, int window, float softcap);
void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float grad_scale, int64_t step);
// adamw on the fp32 master, then in the same pass model[i] = round_bf16(master[i]) and, when
// model_bf16 is given, model_bf16[i] = its bf16 bits (the bf16 policy's working copies).
void adamw_to_bf16(float* master, const float* grad, float* m, float* v, int64_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                   int64_t step, float* model, uint16_t* model_bf16);
double sum_squares(const float* x, int64_t n);
bool all_finite(const float* x, int64_t n);

}  // namespace loom::cpu
