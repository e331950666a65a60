// Launchers of the mixture-of-experts and ring-attention kernels (moe_ring.cu; semantics:
// kernels/backend.h, the MoE and ring attention block). Asynchronous on `st`; scratch and the
// error flag come from the backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace loom::cuda {

void moe_router_forward(cudaStream_t st, float* scores, int32_t* topk_idx, float* topk_w,
                        const float* logits, int N, int E, int k, bool sigmoid, bool renormalize);
void moe_router_backward(cudaStream_t st, float* dlogits, const float* dtopk_w,
                         const float* dscores, const float* scores, const int32_t* topk_idx, int N,
                         int E, int k, bool sigmoid, bool renormalize);
// The aux loss into *loss (device double); dscores (nullable) += its gradient. scratch: 3E
// doubles.
void moe_aux_loss(cudaStream_t st, double* loss, float* dscores, const float* scores,
                  const int32_t* topk_idx, int N, int E, int k, float coeff, float dloss,
                  double* scratch, DeviceError* err);
// scratch: 2E doubles.
void moe_expert_stats(cudaStream_t st, float* stats, const float* scores, const int32_t* topk_idx,
                      int N, int E, int k, double* scratch, DeviceError* err);
void add_row_broadcast(cudaStream_t st, float* x, const float* row, int N, int C);
void moe_plan_routing(cudaStream_t st, int32_t* plan, const int32_t* topk_idx, int N, int E, int k,
                      int capacity, DeviceError* err);
void moe_permute(cudaStream_t st, float* out, const float* x, const int32_t* token_of, int rows,
                 int C);
void moe_permute_backward(cudaStream_t st, float* dx, const float* dout, const int32_t* row_of,
                          int N, int k, int C);
void moe_unpermute(cudaStream_t st, float* y, const float* expert_out, const float* topk_w,
                   const int32_t* row_of, int N, int k, int C);
void moe_unpermute_backward(cudaStream_t st, float* dexpert_out, float* dtopk_w, const float* dy,
                            const float* expert_out, const float* topk_w, const int32_t* row_of,
                            int N, int k, int C);

// Head dims up to kMaxBlockHeadDim (the forward keeps one output row per thread).
constexpr int kMaxBlockHeadDim = 256;
void attention_block_forward(cudaStream_t st, float* out, float* lse, const float* q, int ldq,
                             const float* k, const float* v, int ldk, int nq, int nk, int Hq,
                             int Hkv, int D, float scale);
void attention_block_backward(cudaStream_t st, float* dq, float* dk, float* dv, const float* dout,
                              const float* out, const float* lse, const float* q, int ldq,
                              const float* k, const float* v, int ldk, int nq, int nk, int Hq,
                              int Hkv, int D, float scale);
void attention_merge(cudaStream_t st, float* out, float* lse, const float* out_a,
                     const float* lse_a, const float* out_b, const float* lse_b, int N, int H,
                     int D);
void add_2d(cudaStream_t st, float* dst, int ldd, const float* src, int lds, int rows, int cols);

}  // namespace loom::cuda
