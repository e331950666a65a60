// Host-callable launchers of the CUDA kernels (defined in ops.cu and attention.cu). Every
// launcher is asynchronous on `st`; scratch comes from the caller (the backend's workspace).
// Semantics of each op: kernels/backend.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/launch.h"

namespace loom::cuda {

// Input errors seen on the device (first one wins). Codes:
enum DeviceErrorCode : int {
  kErrNone = 0,
  kErrNegativeId = 1,   // embedding: negative token id
  kErrTargetRange = 2,  // cross_entropy: target >= V
  kErrNegativePos = 3,  // rope: negative position
  kErrExpertRange = 4,  // MoE: an expert index outside [0, E) (row = token, value = index)
  kErrBlockRange = 5,   // paged KV cache: a block index outside the pool (row = chunk)
  kErrPagedTable = 6,   // paged KV cache: a block table too short (row = chunk, value = position)
};
struct DeviceError {
  int code;
  int row;
  int value;
  int op;  // which op recorded it (DeviceOp)
};
enum DeviceOp : int {
  kOpEmbeddingForward = 1,
  kOpEmbeddingBackward,
  kOpCrossEntropy,
  kOpRopeForward,
  kOpRopeBackward,
  kOpMoe,
  kOpPagedKvWrite,
  kOpPagedAttention,
};

// ---- pointwise
void gelu_forward(cudaStream_t st, float* out, const float* inp, int64_t n);
void gelu_backward(cudaStream_t st, float* dinp, const float* inp, const float* dout, int64_t n);
void swiglu_forward(cudaStream_t st, float* out, const float* inp, int N, int F);
void swiglu_backward(cudaStream_t st, float* dinp, const float* inp, const float* dout, int N,
                     int F);
void add(cudaStream_t st, float* out, const float* a, const float* b, int64_t n);
void add_inplace(cudaStream_t st, float* acc, const float* x, int64_t n);
void scale_inplace(cudaStream_t st, float* x, float s, int64_t n);
// Backend::apply_bit_mask.
void apply_bit_mask(cudaStream_t st, float* out, const float* x, const uint64_t* bits, int N, int C,
                    float scale);
void fill(cudaStream_t st, float* x, float value, int64_t n);
// C[i*ldc + j] = beta * C (beta == 0 clears, NaN included): GEMMs with K == 0.
void scale_matrix(cudaStream_t st, float* C, int M, int N, int ldc, float beta);
void round_to(cudaStream_t st, DType t, float* x, int64_t n);
void convert(cudaStream_t st, void* dst, DType dt, const void* src, DType st_type, int64_t n);

// ---- rows
void rope(cudaStream_t st, float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
          float sign, DeviceError* err, int op);
void softmax_forward(cudaStream_t st, float* out, const float* inp, int rows, int cols);
void softmax_backward(cudaStream_t st, float* dinp, const float* out, const float* dout, int rows,
                      int cols);
void cross_entropy(cudaStream_t st, float* losses, float* dlogits, const float* logits,
                   const int32_t* targets, int N, int V, float dloss, const float* weights,
                   DeviceError* err);
void layernorm_forward(cudaStream_t st, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C, float eps);
// partial: colred_chunks(N) * 2 * C floats of scratch.
void layernorm_backward(cudaStream_t st, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C, float* partial);
void rmsnorm_forward(cudaStream_t st, float* out, float* rstd, const float* inp,
                     const float* weight, int N, int C, float eps);
void rmsnorm_backward(cudaStream_t st, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, int N, int C,
                      float* partial);
// dbias[c] += sum_rows dout[r, c]; partial: colred_chunks(N) * C floats.
void bias_backward(cudaStream_t st, float* dbias, const float* dout, int N, int C, float* partial);

// ---- embedding
void embedding_forward(cudaStream_t st, float* out, const int32_t* ids, const float* table, int N,
                       int C, bool accumulate, DeviceError* err);
// Scratch bytes embedding_backward needs for N rows (sort buffers + CUB temp storage).
size_t embedding_backward_scratch(int N);
void embedding_backward(cudaStream_t st, float* dtable, const float* dout, const int32_t* ids,
                        int N, int C, void* scratch, size_t scratch_bytes, DeviceError* err);

// ---- optimizer and reductions
void adamw(cudaStream_t st, float* param, const float* grad, float* m, float* v, int64_t n,
           float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
           float c1, float c2);
struct MtTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  float weight_decay;
  float unused;
};
void adamw_multi(cudaStream_t st, const MtTensor* tensors, const MtChunk* chunks, int nchunks,
                 float lr, float beta1, float beta2, float eps, float grad_scale, float c1,
                 float c2);
// partial: sumsq_blocks(n) doubles; result: one double (device).
void sum_squares(cudaStream_t st, const float* x, int64_t n, double* partial, double* result,
                 bool accumulate_result);
void all_finite(cudaStream_t st, const float* x, int64_t n, int* bad);
// *result (device) = sum w[i] * x[i] in double (w nullable: 1), in a fixed order.
void weighted_sum(cudaStream_t st, const float* x, const float* w, int64_t n, double* result);

// ---- attention (attention.cu). Pointers as in Backend; cu (device copy of cu_seqlens) and
// the schedule items (device copies of AttnSchedule::q_items / k_items).
struct AttnArgs {
  const float *q, *k, *v;
  int ld, Hq, Hkv, D;
  float scale;
  const int32_t* cu;
  const int32_t* q_items;
  int n_q_items;
  const int32_t* k_items;
  int n_k_items;
  int row0, row1;  // cu[0], cu[nseq] (host copies)
  // q/k/v (and dO in backward) start 16-byte aligned and ld % 4 == 0: the tensor-core kernels
  // stage tiles with 16-byte loads.
  bool vec4 = false;
};
void attention_forward(cudaStream_t st, const AttnArgs& a, float* out, float* lse);
// delta[row, h] = sum_d dO * O, the first pass of every attention backward.
void attention_delta(cudaStream_t st, const AttnArgs& a, const float* out, const float* dout,
                     float* delta);
// delta: (row1) * Hq floats of scratch.
void attention_backward(cudaStream_t st, const AttnArgs& a, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, float* delta);

// ---- per-tensor fp8 quantisation (fp8_quant.cu), the CPU recipes' arithmetic.
// *amax (device) = max |x| (bit-pattern compare: NaN wins).
void fp8_amax(cudaStream_t st, const float* x, int64_t n, float* amax);
// dst = fp8 codes (e4m3, or e5m2) of x[rows, cols] * s, stored [rows, cols] or transposed
// [cols, rows]; s = *scale when given (delayed scaling), else fmt_max / *amax / 2^margin (1 if
// *amax is 0 or not finite); *scale_inv = 1/s.
void fp8_quantize(cudaStream_t st, void* dst, bool e5m2, const float* x, int rows, int cols,
                  bool transpose, const float* amax, const float* scale, int margin,
                  float* scale_inv);
// Delayed scaling's bookkeeping, the CPU recipe's arithmetic (Backend::fp8_record_amax and
// fp8_roll_history, whose contracts these kernels implement; the state is held by
// precision/device_fp8_scaling.h): a pending amax of -1 means nothing recorded since the last
// step; pos_count = {pos, count} on the device; the amax rolled may be reduced over ranks.
void fp8_record_amax(cudaStream_t st, const float* amax, float* pending);
void fp8_roll_history(cudaStream_t st, float* history, int len, int32_t* pos_count, float* pending,
                      const float* amax, float* scale, bool e5m2, int margin, bool most_recent);
// MXFP8 (the CPU's mx_quantize): deq[rows, cols] = bf16 values of x's MX quantisation, blocks of
// 32 along the columns (a row's contiguous elements) or along the rows (down each column).
void mx_dequantize(cudaStream_t st, uint16_t* deq, bool e5m2, const float* x, int rows, int cols,
                   bool along_rows);
// y[r, :] = b for every row.
void set_rows(cudaStream_t st, float* y, const float* b, int rows, int cols);

// ---- tensor-core attention (attention_tc.cu): bf16 operands, fp32 softmax and accumulation;
// same arguments and outputs as above. Work items are planned with attn_tc_rows rows.
constexpr int attn_tc_rows = 64;
bool attention_tc_supported(int D);  // D % 16 == 0 and D <= 128
void attention_forward_tc(cudaStream_t st, const AttnArgs& a, float* out, float* lse);
void attention_backward_tc(cudaStream_t st, const AttnArgs& a, const float* out, const float* lse,
                           const float* dout, float* dq, float* dk, float* dv, float* delta);

}  // namespace loom::cuda
