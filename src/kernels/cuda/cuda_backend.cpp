// CudaBackend: argument checks (the same messages as the CPU backend where the CPU checks on
// the host), workspace management, the attention schedule cache, and dispatch to the
// launchers of ops.cu / attention.cu and to cuBLASLt.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe_ring.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/vocab_slice.h"

namespace loom {
namespace {

constexpr size_t kUploadBytes = size_t{4} << 20;  // attention schedules, multi-tensor tables

const char* op_name(int op) {
  switch (op) {
    case cuda::kOpEmbeddingForward:
      return "embedding_forward";
    case cuda::kOpEmbeddingBackward:
      return "embedding_backward";
    case cuda::kOpCrossEntropy:
      return "cross_entropy";
    case cuda::kOpRopeForward:
      return "rope_forward";
    case cuda::kOpRopeBackward:
      return "rope_backward";
    case cuda::kOpMoe:
      return "MoE routing";
    case cuda::kOpPagedKvWrite:
      return "paged_kv_write";
    case cuda::kOpPagedAttention:
      return "paged_attention";
    default:
      return "cuda op";
  }
}

// A pinned host buffer and the device area it is uploaded to. The host side is rewritten only
// after the previous upload from it has completed (event), so uploads never race.
struct UploadArea {
  void* host = nullptr;
  void* dev = nullptr;
  size_t bytes = 0;
  cudaEvent_t done = nullptr;

  void init(void* device_area, size_t n) {
    LOOM_CUDA_CHECK(cudaMallocHost(&host, n));
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    dev = device_area;
    bytes = n;
  }
  void destroy() {
    if (host) cudaFreeHost(host);
    if (done) cudaEventDestroy(done);
    host = nullptr;
    done = nullptr;
  }
  // Copies `n` bytes of `src` to the device area, stream-ordered.
  void upload(cudaStream_t st, const void* src, size_t n, const char* what) {
    LOOM_CHECK(n <= bytes, what, " (cuda): ", n, " bytes of tables exceed the upload area of ",
               bytes);
    LOOM_CUDA_CHECK(cudaEventSynchronize(done));
    std::memcpy(host, src, n);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, st));
    LOOM_CUDA_CHECK(cudaEventRecord(done, st));
  }
};

}  // namespace

GemmMath gemm_math_from_name(const std::string& s) {
  if (s == "fp32") return GemmMath::FP32;
  if (s == "tf32") return GemmMath::TF32;
  if (s == "bf16") return GemmMath::BF16;
  if (s == "fp16") return GemmMath::FP16;
  fail("gemm math must be fp32, tf32, bf16 or fp16, got '", s, "'");
}

const char* gemm_math_name(GemmMath m) {
  switch (m) {
    case GemmMath::FP32:
      return "fp32";
    case GemmMath::TF32:
      return "tf32";
    case GemmMath::BF16:
      return "bf16";
    case GemmMath::FP16:
      return "fp16";
  }
  return "?";
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

struct CudaBackend::Impl {
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::LtGemm> lt;
  cuda::DeviceError* err = nullptr;       // device
  cuda::DeviceError* err_host = nullptr;  // pinned
  double* result = nullptr;               // device: reductions' result
  int* flag = nullptr;                    // device: all_finite
  double* result_host = nullptr;          // pinned
  UploadArea attn_up, table_up;
  // Attention schedule cache: the host cu_seqlens and tile rows it was planned for.
  std::vector<int32_t> cu_cached;
  int rows_cached = -1;
  cuda::AttnSchedule sched;
  const int32_t *cu_dev = nullptr, *q_items_dev = nullptr, *k_items_dev = nullptr;
};

CudaBackend::CudaBackend(const CudaOptions& opt) : opt_(opt), impl_(new Impl) {
  const int count = cuda_device_count();
  LOOM_CHECK(count > 0, "CUDA backend: no CUDA device is available (driver or GPU missing)");
  LOOM_CHECK(opt.device >= 0 && opt.device < count, "CUDA backend: device ", opt.device,
             " does not exist (", count, " devices)");
  LOOM_CUDA_CHECK(cudaSetDevice(opt.device));
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, opt.device));
  device_name_ = prop.name;
  sm_ = prop.major * 10 + prop.minor;
  sm_count_ = prop.multiProcessorCount;
  LOOM_CHECK(sm_ >= 80, "CUDA backend: ", device_name_, " is sm_", sm_,
             "; this build targets sm_80 and sm_90");
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));

  arena_ = DeviceArena(
      [](size_t bytes) -> void* {
        void* p = nullptr;
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
          cudaGetLastError();
          return nullptr;
        }
        return p;
      },
      [](void* p) { cudaFree(p); });
  LOOM_CHECK(opt.workspace_bytes > opt.cublaslt_workspace + 2 * kUploadBytes + (1 << 20),
             "CUDA backend: workspace_bytes=", opt.workspace_bytes, " is too small");
  ws_ = &arena_.create("workspace", opt.workspace_bytes);
  // Permanent parts of the workspace first; everything after them is per-op scratch.
  impl_->lt = std::make_unique<cuda::LtGemm>(ws_->take(opt.cublaslt_workspace, "cuBLASLt"),
                                             opt.cublaslt_workspace, sm_);
  impl_->err = ws_->take_n<cuda::DeviceError>(1, "error flag");
  impl_->result = ws_->take_n<double>(1, "reduction result");
  impl_->flag = ws_->take_n<int>(1, "finite flag");
  impl_->attn_up.init(ws_->take(kUploadBytes, "attention schedule"), kUploadBytes);
  impl_->table_up.init(ws_->take(kUploadBytes, "multi-tensor table"), kUploadBytes);
  LOOM_CUDA_CHECK(
      cudaMallocHost(reinterpret_cast<void**>(&impl_->err_host), sizeof(cuda::DeviceError)));
  LOOM_CUDA_CHECK(
      cudaMallocHost(reinterpret_cast<void**>(&impl_->result_host), 2 * sizeof(double)));
  LOOM_CUDA_CHECK(cudaMemsetAsync(impl_->err, 0, sizeof(cuda::DeviceError), impl_->stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

CudaBackend::~CudaBackend() {
  if (impl_->stream) cudaStreamSynchronize(impl_->stream);
  impl_->lt.reset();
  impl_->attn_up.destroy();
  impl_->table_up.destroy();
  if (impl_->err_host) cudaFreeHost(impl_->err_host);
  if (impl_->result_host) cudaFreeHost(impl_->result_host);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void* CudaBackend::stream() const {
  return impl_->stream;
}

void CudaBackend::check_device_errors() {
  LOOM_CUDA_CHECK(cudaMemcpyAsync(impl_->err_host, impl_->err, sizeof(cuda::DeviceError),
                                  cudaMemcpyDeviceToHost, impl_->stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  const cuda::DeviceError e = *impl_->err_host;
  if (e.code == cuda::kErrNone) return;
  LOOM_CUDA_CHECK(cudaMemsetAsync(impl_->err, 0, sizeof(cuda::DeviceError), impl_->stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  switch (e.code) {
    case cuda::kErrNegativeId:
      fail(op_name(e.op), ": negative token id ", e.value, " at row ", e.row);
    case cuda::kErrTargetRange:
      fail("cross_entropy: target ", e.value, " at row ", e.row, " is outside the vocabulary");
    case cuda::kErrExpertRange:
      fail(op_name(e.op), ": token ", e.row, " has expert ", e.value, ", outside [0, E)");
    case cuda::kErrNegativePos:
      fail("rope: negative position ", e.value, " at row ", e.row);
    case cuda::kErrBlockRange:
      fail(op_name(e.op), ": chunk ", e.row, " names KV block ", e.value, ", outside the pool");
    case cuda::kErrPagedTable:
      fail(op_name(e.op), ": chunk ", e.row, "'s block table does not cover position ", e.value);
    default:
      fail(op_name(e.op), ": device error code ", e.code);
  }
}

void CudaBackend::sync() {
  check_device_errors();
}

void CudaBackend::upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl_->stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

void CudaBackend::download(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

void* CudaBackend::alloc(size_t bytes, const char* cls) {
  void* p = nullptr;
  // Zero bytes still gives a distinct, freeable pointer (as on the CPU backend).
  const size_t n = std::max<size_t>(bytes, 1);
  if (cudaMallocAsync(&p, n, impl_->stream) != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("CUDA backend: out of device memory allocating ", bytes, " bytes of ", cls, " (",
         free_b >> 20, " MiB free of ", total_b >> 20, " MiB)");
  }
  LOOM_CHECK(reinterpret_cast<uintptr_t>(p) % kAlign == 0, "CUDA backend: allocation of ", cls,
             " is not ", kAlign, "-byte aligned");
  ledger_.add(p, n, cls);
  return p;
}

void CudaBackend::free(void* p) {
  if (!p) return;
  ledger_.remove(p, "CUDA");
  // Stream-ordered: ops already queued that use the buffer finish first.
  LOOM_CUDA_CHECK(cudaFreeAsync(p, impl_->stream));
}

void CudaBackend::copy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream));
}

double CudaBackend::weighted_sum(const float* x, const float* w, int64_t n) {
  cuda::weighted_sum(impl_->stream, x, w, n, impl_->result);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(impl_->result_host, impl_->result, sizeof(double),
                                  cudaMemcpyDeviceToHost, impl_->stream));
  check_device_errors();  // synchronises
  return *impl_->result_host;
}

void CudaBackend::fill_bytes(void* dst, int byte, size_t bytes) {
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, impl_->stream));
}

std::string CudaBackend::memory_report() const {
  size_t free_b = 0, total_b = 0;
  std::string s =
      cat("device memory (", device_name_, "):\n", arena_.report(), ledger_.report("cuda"));
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    s += cat("  device: ", (total_b - free_b) >> 20, " MiB used of ", total_b >> 20, " MiB\n");
  return s;
}

// ------------------------------------------------------------------------------------ GEMM

void CudaBackend::gemm_ex(const GemmEx& g) {
  if (g.M == 0 || g.N == 0) return;
  LOOM_CHECK(g.K > 0, "gemm_ex (cuda): K must be positive");
  impl_->lt->run(impl_->stream, g, cuda::compute_type_of(GemmMath::FP32));
}

void CudaBackend::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                       int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  gemm_batched(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

void CudaBackend::gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                               const float* A, int lda, int64_t stride_a, const float* B, int ldb,
                               int64_t stride_b, float beta, float* C, int ldc, int64_t stride_c,
                               int batch) {
  LOOM_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  LOOM_CHECK(batch >= 0, "gemm_batched: negative batch ", batch);
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) {
    for (int b = 0; b < batch; ++b)
      cuda::scale_matrix(impl_->stream, C + b * stride_c, M, N, ldc, beta);
    return;
  }
  GemmEx g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.M = M;
  g.N = N;
  g.K = K;
  g.a_type = g.b_type = g.c_type = DType::F32;
  g.A = A;
  g.lda = lda;
  g.B = B;
  g.ldb = ldb;
  g.C = C;
  g.ldc = ldc;
  g.alpha = alpha;
  g.beta = beta;
  g.batch = batch;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_c = stride_c;
  impl_->lt->run(impl_->stream, g, cuda::compute_type_of(opt_.gemm_math));
}

void CudaBackend::matmul_forward(float* out, const float* inp, const float* weight,
                                 const float* bias, int N, int IC, int OC) {
  if (N == 0 || OC == 0) return;
  if (IC == 0) {
    LOOM_CHECK(bias == nullptr, "matmul_forward (cuda): IC=0 with a bias is not supported");
    cuda::scale_matrix(impl_->stream, out, N, OC, OC, 0.f);
    return;
  }
  GemmEx g;
  g.trans_a = false;
  g.trans_b = true;
  g.M = N;
  g.N = OC;
  g.K = IC;
  g.a_type = g.b_type = g.c_type = DType::F32;
  g.A = inp;
  g.lda = IC;
  g.B = weight;
  g.ldb = IC;
  g.C = out;
  g.ldc = OC;
  g.bias = bias;
  impl_->lt->run(impl_->stream, g, cuda::compute_type_of(opt_.gemm_math));
}

void CudaBackend::matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, int N, int IC, int OC) {
  if (dinp != nullptr) gemm(false, false, N, IC, OC, 1.f, dout, OC, weight, IC, 0.f, dinp, IC);
  if (dweight != nullptr) gemm(true, false, OC, IC, N, 1.f, dout, OC, inp, IC, 1.f, dweight, IC);
  if (dbias != nullptr && N > 0 && OC > 0) {
    ScratchScope scope(*ws_);
    float* partial = ws_->take_n<float>(size_t(cuda::colred_chunks(N)) * OC, "bias partials");
    cuda::bias_backward(impl_->stream, dbias, dout, N, OC, partial);
  }
}

// ------------------------------------------------------------------------------------ rows

void CudaBackend::embedding_forward(float* out, const int32_t* ids, const float* table, int N,
                                    int C, bool accumulate) {
  cuda::embedding_forward(impl_->stream, out, ids, table, N, C, accumulate, impl_->err);
}

void CudaBackend::embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N,
                                     int C) {
  if (N <= 0 || C <= 0) return;
  ScratchScope scope(*ws_);
  const size_t bytes = cuda::embedding_backward_scratch(N);
  void* scratch = ws_->take(bytes, "embedding_backward sort buffers");
  cuda::embedding_backward(impl_->stream, dtable, dout, ids, N, C, scratch, bytes, impl_->err);
}

// ---- vocabulary-slice ops (tensor parallelism; vocab_slice.cu)

void CudaBackend::embedding_forward_slice(float* out, const int32_t* ids, const float* table, int N,
                                          int C, int v0, int V) {
  cuda::embedding_forward_slice(impl_->stream, out, ids, table, N, C, v0, V);
}
void CudaBackend::embedding_backward_slice(float* dtable, const float* dout, const int32_t* ids,
                                           int N, int C, int v0, int V) {
  cuda::embedding_backward_slice(impl_->stream, dtable, dout, ids, N, C, v0, V);
}
void CudaBackend::cross_entropy_slice_max(float* mx, const float* logits, int N, int V) {
  cuda::cross_entropy_slice_max(impl_->stream, mx, logits, N, V);
}
void CudaBackend::cross_entropy_slice_sums(float* se, float* tl, const float* logits,
                                           const float* mx, const int32_t* targets, int N, int V,
                                           int v0) {
  cuda::cross_entropy_slice_sums(impl_->stream, se, tl, logits, mx, targets, N, V, v0);
}
void CudaBackend::cross_entropy_slice_finish(float* losses, float* dlogits, const float* logits,
                                             const float* mx, const float* se, const float* tl,
                                             const int32_t* targets, int N, int V, int v0,
                                             float dloss, const float* weights) {
  cuda::cross_entropy_slice_finish(impl_->stream, losses, dlogits, logits, mx, se, tl, targets, N,
                                   V, v0, dloss, weights);
}
// ---- MoE and ring attention (moe_ring.cu)

void CudaBackend::moe_router_forward(float* scores, int32_t* topk_idx, float* topk_w,
                                     const float* logits, int N, int E, int k, bool sigmoid,
                                     bool renormalize) {
  cuda::moe_router_forward(impl_->stream, scores, topk_idx, topk_w, logits, N, E, k, sigmoid,
                           renormalize);
}
void CudaBackend::moe_router_backward(float* dlogits, const float* dtopk_w, const float* dscores,
                                      const float* scores, const int32_t* topk_idx, int N, int E,
                                      int k, bool sigmoid, bool renormalize) {
  cuda::moe_router_backward(impl_->stream, dlogits, dtopk_w, dscores, scores, topk_idx, N, E, k,
                            sigmoid, renormalize);
}
double CudaBackend::moe_aux_loss(float* dscores, const float* scores, const int32_t* topk_idx,
                                 int N, int E, int k, float coeff, float dloss) {
  {
    ScratchScope scope(*ws_);
    double* scratch = ws_->take_n<double>(3 * size_t(E), "moe aux loss");
    cuda::moe_aux_loss(impl_->stream, impl_->result, dscores, scores, topk_idx, N, E, k, coeff,
                       dloss, scratch, impl_->err);
  }
  LOOM_CUDA_CHECK(cudaMemcpyAsync(impl_->result_host, impl_->result, sizeof(double),
                                  cudaMemcpyDeviceToHost, impl_->stream));
  check_device_errors();  // synchronises
  return *impl_->result_host;
}
void CudaBackend::moe_expert_stats(float* stats, const float* scores, const int32_t* topk_idx,
                                   int N, int E, int k) {
  ScratchScope scope(*ws_);
  double* scratch = ws_->take_n<double>(2 * size_t(E), "moe expert stats");
  cuda::moe_expert_stats(impl_->stream, stats, scores, topk_idx, N, E, k, scratch, impl_->err);
}
void CudaBackend::add_row_broadcast(float* x, const float* row, int N, int C) {
  cuda::add_row_broadcast(impl_->stream, x, row, N, C);
}
void CudaBackend::moe_plan_routing(int32_t* plan, const int32_t* topk_idx, int N, int E, int k,
                                   int capacity) {
  cuda::moe_plan_routing(impl_->stream, plan, topk_idx, N, E, k, capacity, impl_->err);
}
void CudaBackend::moe_permute(float* out, const float* x, const int32_t* token_of, int rows,
                              int C) {
  cuda::moe_permute(impl_->stream, out, x, token_of, rows, C);
}
void CudaBackend::moe_permute_backward(float* dx, const float* dout, const int32_t* row_of, int N,
                                       int k, int C) {
  cuda::moe_permute_backward(impl_->stream, dx, dout, row_of, N, k, C);
}
void CudaBackend::moe_unpermute(float* y, const float* expert_out, const float* topk_w,
                                const int32_t* row_of, int N, int k, int C) {
  cuda::moe_unpermute(impl_->stream, y, expert_out, topk_w, row_of, N, k, C);
}
void CudaBackend::moe_unpermute_backward(float* dexpert_out, float* dtopk_w, const float* dy,
                                         const float* expert_out, const float* topk_w,
                                         const int32_t* row_of, int N, int k, int C) {
  cuda::moe_unpermute_backward(impl_->stream, dexpert_out, dtopk_w, dy, expert_out, topk_w, row_of,
                               N, k, C);
}
void CudaBackend::attention_block_forward(float* out, float* lse, const float* q, int ldq,
                                          const float* k, const float* v, int ldk, int nq, int nk,
                                          int Hq, int Hkv, int D, float scale) {
  cuda::attention_block_forward(impl_->stream, out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D,
                                scale);
}
void CudaBackend::attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                           const float* out, const float* lse, const float* q,
                                           int ldq, const float* k, const float* v, int ldk, int nq,
                                           int nk, int Hq, int Hkv, int D, float scale) {
  cuda::attention_block_backward(impl_->stream, dq, dk, dv, dout, out, lse, q, ldq, k, v, ldk, nq,
                                 nk, Hq, Hkv, D, scale);
}
void CudaBackend::attention_merge(float* out, float* lse, const float* out_a, const float* lse_a,
                                  const float* out_b, const float* lse_b, int N, int H, int D) {
  cuda::attention_merge(impl_->stream, out, lse, out_a, lse_a, out_b, lse_b, N, H, D);
}
void CudaBackend::add_2d(float* dst, int ldd, const float* src, int lds, int rows, int cols) {
  cuda::add_2d(impl_->stream, dst, ldd, src, lds, rows, cols);
}

void CudaBackend::copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch,
                          size_t row_bytes, size_t rows) {
  if (rows == 0 || row_bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, row_bytes, rows,
                                    cudaMemcpyDeviceToDevice, impl_->stream));
}

void CudaBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                    const float* weight, const float* bias, int N, int C,
                                    float eps) {
  cuda::layernorm_forward(impl_->stream, out, mean, rstd, inp, weight, bias, N, C, eps);
}

void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* weight, const float* mean,
                                     const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  ScratchScope scope(*ws_);
  float* partial = ws_->take_n<float>(size_t(cuda::colred_chunks(N)) * 2 * C, "norm partials");
  cuda::layernorm_backward(impl_->stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                           partial);
}

void CudaBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                                  int N, int C, float eps) {
  cuda::rmsnorm_forward(impl_->stream, out, rstd, inp, weight, N, C, eps);
}

void CudaBackend::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                   const float* weight, const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  ScratchScope scope(*ws_);
  float* partial = ws_->take_n<float>(size_t(cuda::colred_chunks(N)) * C, "norm partials");
  cuda::rmsnorm_backward(impl_->stream, dinp, dweight, dout, inp, weight, rstd, N, C, partial);
}

void CudaBackend::gelu_forward(float* out, const float* inp, int64_t n) {
  cuda::gelu_forward(impl_->stream, out, inp, n);
}
void CudaBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  cuda::gelu_backward(impl_->stream, dinp, inp, dout, n);
}
void CudaBackend::swiglu_forward(float* out, const float* inp, int N, int F) {
  cuda::swiglu_forward(impl_->stream, out, inp, N, F);
}
void CudaBackend::swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
  cuda::swiglu_backward(impl_->stream, dinp, inp, dout, N, F);
}

namespace {
void check_rope(int H, int D, int ld, float theta) {
  LOOM_CHECK(D > 0 && D % 2 == 0, "rope: head dim D=", D, " must be even and positive");
  LOOM_CHECK(ld >= H * D, "rope: row stride ld=", ld, " < H*D=", H * D);
  LOOM_CHECK(theta > 0.0f, "rope: theta=", theta, " must be positive");
}
}  // namespace

void CudaBackend::rope_forward(float* x, const int32_t* pos, int N, int H, int D, int ld,
                               float theta) {
  check_rope(H, D, ld, theta);
  cuda::rope(impl_->stream, x, pos, N, H, D, ld, theta, 1.f, impl_->err, cuda::kOpRopeForward);
}
void CudaBackend::rope_backward(float* dx, const int32_t* pos, int N, int H, int D, int ld,
                                float theta) {
  check_rope(H, D, ld, theta);
  cuda::rope(impl_->stream, dx, pos, N, H, D, ld, theta, -1.f, impl_->err, cuda::kOpRopeBackward);
}

void CudaBackend::add(float* out, const float* a, const float* b, int64_t n) {
  cuda::add(impl_->stream, out, a, b, n);
}
void CudaBackend::add_inplace(float* acc, const float* x, int64_t n) {
  cuda::add_inplace(impl_->stream, acc, x, n);
}
void CudaBackend::scale_inplace(float* x, float s, int64_t n) {
  cuda::scale_inplace(impl_->stream, x, s, n);
}
void CudaBackend::apply_bit_mask(float* out, const float* x, const uint64_t* bits, int N, int C,
                                 float scale) {
  cuda::apply_bit_mask(impl_->stream, out, x, bits, N, C, scale);
}
void CudaBackend::softmax_forward(float* out, const float* inp, int rows, int cols) {
  cuda::softmax_forward(impl_->stream, out, inp, rows, cols);
}
void CudaBackend::softmax_backward(float* dinp, const float* out, const float* dout, int rows,
                                   int cols) {
  cuda::softmax_backward(impl_->stream, dinp, out, dout, rows, cols);
}

void CudaBackend::cross_entropy(float* losses, float* dlogits, const float* logits,
                                const int32_t* targets, int N, int V, float dloss,
                                const float* weights) {
  LOOM_CHECK(V > 0, "cross_entropy: vocabulary size V=", V, " must be positive");
  cuda::cross_entropy(impl_->stream, losses, dlogits, logits, targets, N, V, dloss, weights,
                      impl_->err);
}

// ------------------------------------------------------------------------------- attention

namespace {
void check_attention(int ld, const int32_t* cu, int nseq, int Hq, int Hkv, int D, float scale,
                     const char* op) {
  LOOM_CHECK(Hq > 0 && Hkv > 0 && D > 0, op, ": bad head counts/dim Hq=", Hq, " Hkv=", Hkv,
             " D=", D);
  LOOM_CHECK(Hq % Hkv == 0, op, ": Hq=", Hq, " is not a multiple of Hkv=", Hkv);
  LOOM_CHECK(scale > 0.0f && std::isfinite(scale), op, ": scale=", scale,
             " must be positive and finite");
  LOOM_CHECK(int64_t{ld} >= int64_t{std::max(Hq, Hkv)} * D, op, ": row stride ld=", ld,
             " is smaller than a head block of ", std::max(Hq, Hkv), "x", D);
  LOOM_CHECK(nseq >= 0, op, ": nseq=", nseq, " is negative");
  LOOM_CHECK(nseq == 0 || cu != nullptr, op, ": cu_seqlens is null");
  if (nseq > 0) {
    LOOM_CHECK(cu[0] >= 0, op, ": cu_seqlens[0]=", cu[0], " is negative");
    for (int s = 0; s < nseq; ++s)
      LOOM_CHECK(cu[s + 1] >= cu[s], op, ": cu_seqlens decreases at index ", s + 1, " (", cu[s],
                 " -> ", cu[s + 1], ")");
  }
  cuda::attn_tile_config(D);  // throws for unsupported head dims
}
}  // namespace

namespace {
bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
}  // namespace

bool CudaBackend::tensor_core_attention(int D) const {
  const bool want = opt_.attention_math == AttnMath::BF16 ||
                    (opt_.attention_math == AttnMath::Auto &&
                     (opt_.gemm_math == GemmMath::BF16 || opt_.gemm_math == GemmMath::FP16));
  return want && sm_ >= 80 && cuda::attention_tc_supported(D);
}

void CudaBackend::attn_upload_schedule(const int32_t* cu, int nseq, int rows) {
  Impl& m = *impl_;
  if (rows == m.rows_cached && m.cu_cached.size() == size_t(nseq) + 1 &&
      std::equal(cu, cu + nseq + 1, m.cu_cached.begin()))
    return;
  m.sched = cuda::plan_attention(cu, nseq, rows);
  // One upload: [cu (nseq + 1) | q_items | k_items], each part 256-byte aligned.
  auto al = [](size_t n) { return (n + 63) / 64 * 64; };
  const size_t n_cu = al(nseq + 1), n_q = al(m.sched.q_items.size()),
               n_k = al(m.sched.k_items.size());
  std::vector<int32_t> buf(n_cu + n_q + n_k, 0);
  std::copy(cu, cu + nseq + 1, buf.begin());
  std::copy(m.sched.q_items.begin(), m.sched.q_items.end(), buf.begin() + n_cu);
  std::copy(m.sched.k_items.begin(), m.sched.k_items.end(), buf.begin() + n_cu + n_q);
  m.attn_up.upload(m.stream, buf.data(), buf.size() * sizeof(int32_t), "attention schedule");
  const int32_t* base = static_cast<const int32_t*>(m.attn_up.dev);
  m.cu_dev = base;
  m.q_items_dev = base + n_cu;
  m.k_items_dev = base + n_cu + n_q;
  m.cu_cached.assign(cu, cu + nseq + 1);
  m.rows_cached = rows;
}

cuda::AttnArgs CudaBackend::attn_args(const float* q, const float* k, const float* v, int ld,
                                      const int32_t* cu, int nseq, int Hq, int Hkv, int D,
                                      float scale, bool tc) {
  attn_upload_schedule(cu, nseq, tc ? cuda::attn_tc_rows : cuda::attn_tile_config(D).rows);
  const Impl& m = *impl_;
  cuda::AttnArgs a{q,
                   k,
                   v,
                   ld,
                   Hq,
                   Hkv,
                   D,
                   scale,
                   m.cu_dev,
                   m.q_items_dev,
                   m.sched.num_q_items(),
                   m.k_items_dev,
                   m.sched.num_k_items(),
                   cu[0],
                   cu[nseq]};
  a.vec4 = tc && aligned16(q) && aligned16(k) && aligned16(v) && ld % 4 == 0;
  return a;
}

void CudaBackend::attention_forward(float* out, float* lse, const float* q, const float* k,
                                    const float* v, int ld, const int32_t* cu_seqlens, int nseq,
                                    int Hq, int Hkv, int D, float scale) {
  check_attention(ld, cu_seqlens, nseq, Hq, Hkv, D, scale, "attention_forward");
  if (nseq == 0 || cu_seqlens[nseq] == cu_seqlens[0]) return;
  const bool tc = tensor_core_attention(D);
  const cuda::AttnArgs a = attn_args(q, k, v, ld, cu_seqlens, nseq, Hq, Hkv, D, scale, tc);
  const Impl& m = *impl_;
  if (tc)
    cuda::attention_forward_tc(m.stream, a, out, lse);
  else
    cuda::attention_forward(m.stream, a, out, lse);
}

void CudaBackend::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                     const float* q, const float* k, const float* v,
                                     const float* out, const float* lse, int ld,
                                     const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D,
                                     float scale) {
  check_attention(ld, cu_seqlens, nseq, Hq, Hkv, D, scale, "attention_backward");
  if (nseq == 0 || cu_seqlens[nseq] == cu_seqlens[0]) return;
  LOOM_CHECK(dq != q && dk != k && dv != v,
             "attention_backward: dq/dk/dv must not alias q/k/v (they are read while written)");
  const bool tc = tensor_core_attention(D);
  cuda::AttnArgs a = attn_args(q, k, v, ld, cu_seqlens, nseq, Hq, Hkv, D, scale, tc);
  const Impl& m = *impl_;
  ScratchScope scope(*ws_);
  float* delta = ws_->take_n<float>(size_t(cu_seqlens[nseq]) * Hq, "attention delta");
  if (tc) {
    a.vec4 = a.vec4 && aligned16(dout);
    cuda::attention_backward_tc(m.stream, a, out, lse, dout, dq, dk, dv, delta);
  } else {
    cuda::attention_backward(m.stream, a, out, lse, dout, dq, dk, dv, delta);
  }
}

// ------------------------------------------------------------------------------- optimizer

namespace {
void bias_corrections(float beta1, float beta2, int64_t step, float& c1, float& c2) {
  LOOM_CHECK(step >= 1, "adamw: step=", step, " must be >= 1 (bias correction is 1-based)");
  c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), step)));
  c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), step)));
}
}  // namespace

void CudaBackend::adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                        float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                        int64_t step) {
  float c1, c2;
  bias_corrections(beta1, beta2, step, c1, c2);
  cuda::adamw(impl_->stream, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale,
              c1, c2);
}

void CudaBackend::adamw_multi(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h) {
  float c1, c2;
  bias_corrections(h.beta1, h.beta2, h.step, c1, c2);
  if (tensors.empty()) return;
  std::vector<int64_t> sizes;
  std::vector<cuda::MtTensor> table;
  for (const AdamWTensor& t : tensors) {
    sizes.push_back(t.n);
    table.push_back({t.param, t.grad, t.m, t.v, t.weight_decay, 0.f});
  }
  const std::vector<cuda::MtChunk> chunks = cuda::multi_tensor_chunks(sizes, int64_t{1} << 16);
  if (chunks.empty()) return;
  // [tensors | chunks] in one upload; both parts 256-byte aligned.
  const size_t tb = align_up(table.size() * sizeof(cuda::MtTensor), 256);
  std::vector<char> buf(tb + chunks.size() * sizeof(cuda::MtChunk), 0);
  std::memcpy(buf.data(), table.data(), table.size() * sizeof(cuda::MtTensor));
  std::memcpy(buf.data() + tb, chunks.data(), chunks.size() * sizeof(cuda::MtChunk));
  impl_->table_up.upload(impl_->stream, buf.data(), buf.size(), "adamw_multi");
  const char* dev = static_cast<const char*>(impl_->table_up.dev);
  cuda::adamw_multi(impl_->stream, reinterpret_cast<const cuda::MtTensor*>(dev),
                    reinterpret_cast<const cuda::MtChunk*>(dev + tb),
                    static_cast<int>(chunks.size()), h.lr, h.beta1, h.beta2, h.eps, h.grad_scale,
                    c1, c2);
}

double CudaBackend::sum_squares(const float* x, int64_t n) {
  return sum_squares_multi({{x, n}});
}

double CudaBackend::sum_squares_multi(const std::vector<std::pair<const float*, int64_t>>& parts) {
  {
    ScratchScope scope(*ws_);
    double* partial = ws_->take_n<double>(1024, "sum_squares partials");
    if (parts.empty())
      LOOM_CUDA_CHECK(cudaMemsetAsync(impl_->result, 0, sizeof(double), impl_->stream));
    for (size_t i = 0; i < parts.size(); ++i)
      cuda::sum_squares(impl_->stream, parts[i].first, parts[i].second, partial, impl_->result,
                        i > 0);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(impl_->result_host, impl_->result, sizeof(double),
                                    cudaMemcpyDeviceToHost, impl_->stream));
  }
  check_device_errors();  // synchronises
  return *impl_->result_host;
}

bool CudaBackend::all_finite(const float* x, int64_t n) {
  cuda::all_finite(impl_->stream, x, n, impl_->flag);
  int bad = 0;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(impl_->result_host, impl_->flag, sizeof(int),
                                  cudaMemcpyDeviceToHost, impl_->stream));
  check_device_errors();
  std::memcpy(&bad, impl_->result_host, sizeof(int));
  return bad == 0;
}

void CudaBackend::paged_kv_write(const PagedKvBuffers& cache, const float* k_new,
                                 const float* v_new, int ld, const int32_t* chunks, int nchunks,
                                 int rows) {
  cuda::paged_kv_write(impl_->stream, cache, k_new, v_new, ld, chunks, nchunks, rows, impl_->err);
}

void CudaBackend::paged_attention(float* out, const float* q, int ldq, const PagedKvBuffers& cache,
                                  const int32_t* chunks, int nchunks, int rows, int Hq,
                                  float scale) {
  cuda::paged_attention(impl_->stream, out, q, ldq, cache, chunks, nchunks, rows, Hq, scale,
                        impl_->err);
}

void CudaBackend::fp8_amax(const float* x, int64_t n, float* amax) {
  cuda::fp8_amax(impl_->stream, x, n, amax);
}

void CudaBackend::fp8_record_amax(float* pending, const float* amax) {
  cuda::fp8_record_amax(impl_->stream, amax, pending);
}

void CudaBackend::fp8_roll_history(float* history, int len, int32_t* pos_count, float* pending,
                                   const float* amax, float* scale, bool e5m2, int margin,
                                   bool most_recent) {
  cuda::fp8_roll_history(impl_->stream, history, len, pos_count, pending, amax, scale, e5m2, margin,
                         most_recent);
}

void CudaBackend::round_to(DType t, float* x, int64_t n, void* store) {
  cuda::round_to(impl_->stream, t, x, n);
  if (store) cuda::convert(impl_->stream, store, t, x, DType::F32, n);
}

void CudaBackend::convert(void* dst, DType dt, const void* src, DType st, int64_t n) {
  cuda::convert(impl_->stream, dst, dt, src, st, n);
}

}  // namespace loom
