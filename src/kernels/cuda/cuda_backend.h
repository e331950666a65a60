// The CUDA backend: every Backend op on device pointers of one GPU, on one stream.
//
// Pointers: every float/int32 buffer an op takes is DEVICE memory, except `cu_seqlens` of the
// attention ops, which stays a HOST array as on the CPU backend (the caller already validates
// it on the host, and the grid of the attention kernels is planned from it). The backend keeps
// a device copy of the last cu_seqlens it saw, so forward and backward of every layer of a
// step upload it once.
//
// Ops are asynchronous (stream-ordered) except those that return a value to the host
// (sum_squares, all_finite) and sync(). Input errors that only the device sees (negative token
// ids, targets outside the vocabulary, negative positions) are recorded in a device flag and
// thrown as loom::Error by the next synchronising call.
//
// Memory: the backend's own scratch (cuBLASLt workspace, reduction partials, sort buffers,
// attention schedules) is one allocation made at construction (CudaOptions::workspace_bytes);
// no op allocates. Callers get the same discipline for their buffers through arena(); the
// Backend's alloc / free (BackendBuffer) are stream-ordered cudaMallocAsync / cudaFreeAsync,
// one device allocation per buffer, accounted per buffer class in memory_report().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cuda/arena.h"
#include "kernels/memory_ledger.h"

namespace loom {
namespace cuda {
struct AttnArgs;
}

// How the fp32 Backend GEMMs use the tensor cores: exact fp32, TF32 inputs, or inputs rounded
// to bf16 / fp16 (always fp32 accumulation and fp32 output).
enum class GemmMath : uint8_t { FP32, TF32, BF16, FP16 };
GemmMath gemm_math_from_name(const std::string& s);  // fp32 | tf32 | bf16 | fp16
const char* gemm_math_name(GemmMath m);

// Attention on the tensor cores (bf16 q/k/v/dO tiles, P and dS rounded to bf16 for their
// products, fp32 softmax and accumulation; head dims D % 16 == 0, D <= 128) or in fp32 on the
// CUDA cores. Auto: tensor cores when gemm_math is BF16 or FP16, whose GEMMs round their inputs
// alike; fp32 otherwise and for head dims the tensor-core kernels do not take.
enum class AttnMath : uint8_t { Auto, FP32, BF16 };

struct CudaOptions {
  int device = 0;
  GemmMath gemm_math = GemmMath::TF32;
  AttnMath attention_math = AttnMath::Auto;
  size_t workspace_bytes = size_t{512} << 20;    // the backend's scratch, allocated up front
  size_t cublaslt_workspace = size_t{32} << 20;  // part of it reserved for cuBLASLt
};

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int cuda_device_count();

// A typed GEMM through cuBLASLt, row-major like Backend::gemm:
// C[M,N] = alpha * a_scale * b_scale * op(A) op(B) + beta * C (+ bias[N] if given).
// A and B: F32, BF16, F16, or (sm_89+: Hopper) F8E4M3 / F8E5M2 with per-tensor scales
// (device float pointers) and the layout cuBLASLt requires for fp8: A [M,K] not transposed,
// B stored [N,K] (trans_b). C: F32, BF16 or F16. bias: fp32 device vector of N (non-fp8 only).
struct GemmEx {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  DType a_type = DType::BF16, b_type = DType::BF16, c_type = DType::F32;
  const void* A = nullptr;
  int lda = 0;
  const void* B = nullptr;
  int ldb = 0;
  void* C = nullptr;
  int ldc = 0;
  float alpha = 1.f, beta = 0.f;
  const float* bias = nullptr;
  const float* a_scale = nullptr;  // fp8 only (device, 16-byte aligned)
  const float* b_scale = nullptr;  // fp8 only (device, 16-byte aligned)
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements
};

// One tensor of a multi-tensor AdamW step (device pointers; weight decay per tensor).
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
  float weight_decay;
};

struct AdamWHyper {
  float lr, beta1, beta2, eps, grad_scale;
  int64_t step;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& opt = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::CUDA; }

  // Memory (Backend): device buffers, stream-ordered. copy_h2d and copy_d2h are synchronous
  // (pageable host memory); copy_d2d and fill_bytes are queued on the stream.
  void* alloc(size_t bytes, const char* cls) override;
  void free(void* p) override;
  void copy_h2d(void* dst, const void* src, size_t bytes) override { upload(dst, src, bytes); }
  void copy_d2h(void* dst, const void* src, size_t bytes) override { download(dst, src, bytes); }
  void copy_d2d(void* dst, const void* src, size_t bytes) override;

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override;
  void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                    float beta, float* C, int ldc, int64_t stride_c, int batch) override;
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int IC, int OC) override;
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override;
  void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                         bool accumulate) override;
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N,
                          int C) override;
  void embedding_forward_slice(float* out, const int32_t* ids, const float* table, int N, int C,
                               int v0, int V) override;
  void embedding_backward_slice(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                                int v0, int V) override;
  void cross_entropy_slice_max(float* mx, const float* logits, int N, int V) override;
  void cross_entropy_slice_sums(float* se, float* tl, const float* logits, const float* mx,
                                const int32_t* targets, int N, int V, int v0) override;
  void cross_entropy_slice_finish(float* losses, float* dlogits, const float* logits,
                                  const float* mx, const float* se, const float* tl,
                                  const int32_t* targets, int N, int V, int v0, float dloss,
                                  const float* weights) override;
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t row_bytes,
               size_t rows) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C, float eps) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) override;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int N, int C) override;
  void gelu_forward(float* out, const float* inp, int64_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void swiglu_forward(float* out, const float* inp, int N, int F) override;
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override;
  void rope_forward(float* x, const int32_t* pos, int N, int H, int D, int ld,
                    float theta) override;
  void rope_backward(float* dx, const int32_t* pos, int N, int H, int D, int ld,
                     float theta) override;
  void add(float* out, const float* a, const float* b, int64_t n) override;
  void add_inplace(float* acc, const float* x, int64_t n) override;
  void scale_inplace(float* x, float s, int64_t n) override;
  void apply_bit_mask(float* out, const float* x, const uint64_t* bits, int N, int C,
                      float scale) override;
  void softmax_forward(float* out, const float* inp, int rows, int cols) override;
  void softmax_backward(float* dinp, const float* out, const float* dout, int rows,
                        int cols) override;
  void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                     int N, int V, float dloss, const float* weights) override;
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int ld, const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D,
                         float scale) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          int ld, const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D,
                          float scale) override;
  void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float grad_scale, int64_t step) override;
  double sum_squares(const float* x, int64_t n) override;
  bool all_finite(const float* x, int64_t n) override;
  double weighted_sum(const float* x, const float* w, int64_t n) override;

  // MoE and ring attention (moe_ring.cu)
  void moe_router_forward(float* scores, int32_t* topk_idx, float* topk_w, const float* logits,
                          int N, int E, int k, bool sigmoid, bool renormalize) override;
  void moe_router_backward(float* dlogits, const float* dtopk_w, const float* dscores,
                           const float* scores, const int32_t* topk_idx, int N, int E, int k,
                           bool sigmoid, bool renormalize) override;
  double moe_aux_loss(float* dscores, const float* scores, const int32_t* topk_idx, int N, int E,
                      int k, float coeff, float dloss) override;
  void moe_expert_stats(float* stats, const float* scores, const int32_t* topk_idx, int N, int E,
                        int k) override;
  void add_row_broadcast(float* x, const float* row, int N, int C) override;
  void moe_plan_routing(int32_t* plan, const int32_t* topk_idx, int N, int E, int k,
                        int capacity) override;
  void moe_permute(float* out, const float* x, const int32_t* token_of, int rows, int C) override;
  void moe_permute_backward(float* dx, const float* dout, const int32_t* row_of, int N, int k,
                            int C) override;
  void moe_unpermute(float* y, const float* expert_out, const float* topk_w, const int32_t* row_of,
                     int N, int k, int C) override;
  void moe_unpermute_backward(float* dexpert_out, float* dtopk_w, const float* dy,
                              const float* expert_out, const float* topk_w, const int32_t* row_of,
                              int N, int k, int C) override;
  void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k,
                               const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                               float scale) override;
  void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q, int ldq,
                                const float* k, const float* v, int ldk, int nq, int nk, int Hq,
                                int Hkv, int D, float scale) override;
  void attention_merge(float* out, float* lse, const float* out_a, const float* lse_a,
                       const float* out_b, const float* lse_b, int N, int H, int D) override;
  void add_2d(float* dst, int ldd, const float* src, int lds, int rows, int cols) override;

  // Serving over the paged KV cache (kernels/cuda/paged_attention.cu).
  void paged_kv_write(const PagedKvBuffers& cache, const float* k_new, const float* v_new, int ld,
                      const int32_t* chunks, int nchunks, int rows) override;
  void paged_attention(float* out, const float* q, int ldq, const PagedKvBuffers& cache,
                       const int32_t* chunks, int nchunks, int rows, int Hq, float scale) override;

  // Delayed fp8 scaling's bookkeeping (kernels/cuda/fp8_quant.cu).
  void fp8_amax(const float* x, int64_t n, float* amax) override;
  void fp8_record_amax(float* pending, const float* amax) override;
  void fp8_roll_history(float* history, int len, int32_t* pos_count, float* pending,
                        const float* amax, float* scale, bool e5m2, int margin,
                        bool most_recent) override;

  // ---- CUDA-only entry points
  void gemm_ex(const GemmEx& g);
  // Every tensor of a model in one launch (chunks of 64K elements; the table is uploaded
  // through the backend's pinned staging buffer).
  void adamw_multi(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h);
  // Rounds x in place to the precision of `t` (BF16, F16, F8E4M3, F8E5M2), as core's round_to.
  void round_to(DType t, float* x, int64_t n, void* store) override;
  // dst (type dt) <- src (type st), elementwise, round to nearest even; F32/BF16/F16/F8*.
  void convert(void* dst, DType dt, const void* src, DType st, int64_t n) override;
  // Sum of squares of several device arrays in one deterministic reduction.
  double sum_squares_multi(const std::vector<std::pair<const float*, int64_t>>& parts);

  void set_gemm_math(GemmMath m) { opt_.gemm_math = m; }
  GemmMath gemm_math() const { return opt_.gemm_math; }
  void set_attention_math(AttnMath m) { opt_.attention_math = m; }
  // Whether attention with head dim D runs on the tensor cores under the current options.
  bool tensor_core_attention(int D) const;

  // Memory helpers (synchronous unless named async).
  void upload(void* dst, const void* src, size_t bytes);
  void download(void* dst, const void* src, size_t bytes);
  void fill_bytes(void* dst, int byte, size_t bytes) override;  // async
  void sync() override;  // waits for the stream, then throws any recorded input error
  void* stream() const;  // cudaStream_t

  // Buffer classes for callers (params, grads, optimizer state, activations): one device
  // allocation per class, peak usage reported.
  DeviceArena& arena() { return arena_; }
  // Peak device memory: arena classes, the backend's workspace high-water mark, and the
  // device's own used/total figures.
  std::string memory_report() const override;
  size_t workspace_peak() const { return ws_->peak(); }
  const std::string& device_name() const { return device_name_; }
  int sm_version() const { return sm_; }  // e.g. 90
  int sm_count() const { return sm_count_; }

 private:
  struct Impl;
  void check_device_errors();
  void attn_upload_schedule(const int32_t* cu_seqlens, int nseq, int rows);
  // Uploads the schedule (tiles of the tensor-core or fp32 kernels) and fills the arguments.
  cuda::AttnArgs attn_args(const float* q, const float* k, const float* v, int ld,
                           const int32_t* cu, int nseq, int Hq, int Hkv, int D, float scale,
                           bool tc);

  CudaOptions opt_;
  DeviceArena arena_;
  MemoryLedger ledger_;       // Backend::alloc's buffers
  BumpRegion* ws_ = nullptr;  // the backend's own workspace: class "workspace" of arena_
  std::unique_ptr<Impl> impl_;
  std::string device_name_;
  int sm_ = 0, sm_count_ = 0;
};

}  // namespace loom
