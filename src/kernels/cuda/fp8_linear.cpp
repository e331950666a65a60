#include "kernels/cuda/fp8_linear.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "core/error.h"
#include "kernels/cuda/kernels.h"

namespace loom {
namespace {
// Slots of scalars_ (floats, 16 bytes apart: cuBLASLt refuses unaligned scale pointers): the
// amax of the tensor being quantised, the three inverse scales.
constexpr int kAmax = 0, kSinv = 4, kScalars = 16;
int sinv_slot(int t) {
  return kSinv + 4 * t;
}

// C[M, N] (fp32; beta 1 accumulates) = op(A) op(B), row-major operands without padding: A is
// [M, K] ([K, M] when trans_a), B is [K, N] ([N, K] when trans_b).
GemmEx gemm_of(bool trans_a, bool trans_b, int M, int N, int K, DType ta, const void* A, DType tb,
               const void* B, float* C, float beta) {
  GemmEx g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.M = M;
  g.N = N;
  g.K = K;
  g.a_type = ta;
  g.b_type = tb;
  g.c_type = DType::F32;
  g.A = A;
  g.lda = trans_a ? M : K;
  g.B = B;
  g.ldb = trans_b ? K : N;
  g.C = C;
  g.ldc = N;
  g.beta = beta;
  return g;
}
}  // namespace

CudaFp8Scratch::CudaFp8Scratch(int max_tokens, int max_features, size_t max_weight,
                               int element_bytes)
    : max_tokens_(max_tokens),
      max_features_(max_features),
      max_weight_(max_weight),
      element_bytes_(element_bytes) {
  LOOM_CHECK(element_bytes == 1 || element_bytes == 2, "fp8 scratch: element size ", element_bytes,
             " is neither 1 nor 2 bytes");
  const size_t act = align_up(size_t(max_tokens) * size_t(max_features) * element_bytes, 256);
  const size_t bytes = 2 * act + align_up(max_weight * element_bytes, 256);
  LOOM_CHECK(cudaMalloc(&mem_, bytes) == cudaSuccess, "fp8 linear (cuda): cannot allocate ",
             bytes >> 20, " MiB of scratch");
  auto* base = static_cast<uint8_t*>(mem_);
  xq = base;
  dyq = base + act;
  wq = base + 2 * act;
}

CudaFp8Scratch::~CudaFp8Scratch() {
  cudaFree(mem_);
}

void CudaFp8Scratch::check(int N, int in, int out) const {
  LOOM_CHECK(N % 16 == 0 && in % 16 == 0 && out % 16 == 0,
             "fp8 linear (cuda): tokens, in and out must be multiples of 16 (got N=", N, " in=", in,
             " out=", out, ")");
  LOOM_CHECK(N <= max_tokens_ && in <= max_features_ && out <= max_features_ &&
                 size_t(in) * size_t(out) <= max_weight_,
             "fp8 linear (cuda): layer ", N, "x", in, "->", out, " exceeds the scratch sized for ",
             max_tokens_, " tokens, ", max_features_, " features");
}

CudaFp8Linear::CudaFp8Linear(CudaBackend& be, const CudaFp8Options& o, CudaFp8Scratch& scratch)
    : be_(be), opt_(o), scratch_(scratch) {
  LOOM_CHECK(scratch.element_bytes() == (o.mx ? 2 : 1), "fp8 linear (cuda): the scratch holds ",
             scratch.element_bytes(), "-byte elements; this layer needs ", o.mx ? 2 : 1);
  LOOM_CHECK(!o.mx || o.amax_history == 0, "fp8 linear (cuda): MXFP8 has no amax history");
  LOOM_CHECK(o.mx || be.sm_version() >= 89,
             "fp8 linear layers need fp8 tensor cores (sm_89 or newer); ", be.device_name(),
             " is sm_", be.sm_version(),
             ": use precision.fp8_recipe = \"none\" or mxfp8 emulation there");
  LOOM_CHECK(o.margin >= 0 && o.margin <= 30, "fp8 margin ", o.margin, " outside [0, 30]");
  LOOM_CHECK(o.amax_history >= 0 && o.amax_history <= (1 << 20), "fp8 amax history ",
             o.amax_history, " outside [0, 2^20]");
  LOOM_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&scalars_), kScalars * sizeof(float)) == cudaSuccess,
      "fp8 linear (cuda): cannot allocate its scales");
  const std::vector<float> init(kScalars, 0.f);
  be.upload(scalars_, init.data(), kScalars * sizeof(float));
}

CudaFp8Linear::~CudaFp8Linear() {
  cudaFree(scalars_);
}

void CudaFp8Linear::quantize(Tensor t, void* dst, const float* v, int rows, int cols,
                             bool transpose, float* sinv) {
  auto st = static_cast<cudaStream_t>(be_.stream());
  const bool e5m2 = t == DY && opt_.hybrid;
  cuda::fp8_amax(st, v, int64_t(rows) * cols, scalars_ + kAmax);
  const float* scale = nullptr;
  if (delayed()) {
    LOOM_CHECK(ext_scales_ != nullptr, "fp8 linear (cuda): delayed scaling without its state ",
               "(use_delayed_state: precision/device_fp8_scaling.h holds it)");
    ext_record_(t, scalars_ + kAmax);
    scale = ext_scales_ + t;
  } else if (reduce_amax) {
    reduce_amax(scalars_ + kAmax);
  }
  cuda::fp8_quantize(st, dst, e5m2, v, rows, cols, transpose, scalars_ + kAmax, scale, opt_.margin,
                     sinv);
}

void CudaFp8Linear::use_delayed_state(const float* scales,
                                      std::function<void(int tensor, const float* amax)> record) {
  LOOM_CHECK(delayed() && scales != nullptr && record,
             "fp8 linear (cuda): an external delayed-scaling state needs delayed scaling, its ",
             "scales and a recorder");
  ext_scales_ = scales;
  ext_record_ = std::move(record);
}

float CudaFp8Linear::scale(Tensor t) const {
  if (!delayed()) return 1.f;
  LOOM_CHECK(ext_scales_ != nullptr, "fp8 linear (cuda): delayed scaling without its state");
  float s = 0.f;
  be_.download(&s, ext_scales_ + t, sizeof s);
  return s;
}

void CudaFp8Linear::forward(float* y, const float* x, const float* w, const float* b, int N, int in,
                            int out) {
  if (N == 0 || out == 0) return;
  scratch_.check(N, in, out);
  // y seeded with the bias: the GEMM adds onto it.
  if (b != nullptr) cuda::set_rows(static_cast<cudaStream_t>(be_.stream()), y, b, N, out);
  const float beta = b != nullptr ? 1.f : 0.f;
  if (opt_.mx) return mx_forward(y, x, w, N, in, out, beta);
  quantize(X, scratch_.xq, x, N, in, false, scalars_ + sinv_slot(X));
  quantize(W, scratch_.wq, w, out, in, false, scalars_ + sinv_slot(W));
  GemmEx g = gemm_of(false, true, N, out, in, DType::F8E4M3, scratch_.xq, DType::F8E4M3,
                     scratch_.wq, y, beta);
  g.a_scale = scalars_ + sinv_slot(X);
  g.b_scale = scalars_ + sinv_slot(W);
  be_.gemm_ex(g);
}

void CudaFp8Linear::backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                             const float* w, int N, int in, int out) {
  if (N == 0) return;
  scratch_.check(N, in, out);
  if (opt_.mx) {
    mx_backward(dx, dw, dy, x, w, N, in, out);
    if (db != nullptr) be_.matmul_backward(nullptr, nullptr, db, dy, x, w, N, in, out);
    return;
  }
  const DType gt = opt_.hybrid ? DType::F8E5M2 : DType::F8E4M3;
  if (dx != nullptr) {  // dx[N, in] = dy[N, out] W[out, in]: B is W^T stored [in, out]
    quantize(DY, scratch_.dyq, dy, N, out, false, scalars_ + sinv_slot(DY));
    quantize(W, scratch_.wq, w, out, in, true, scalars_ + sinv_slot(W));
    GemmEx g =
        gemm_of(false, true, N, in, out, gt, scratch_.dyq, DType::F8E4M3, scratch_.wq, dx, 0.f);
    g.a_scale = scalars_ + sinv_slot(DY);
    g.b_scale = scalars_ + sinv_slot(W);
    be_.gemm_ex(g);
  }
  if (dw != nullptr) {  // dW[out, in] += dy^T x: A = dy^T [out, N], B = x^T stored [in, N]
    quantize(DY, scratch_.dyq, dy, N, out, true, scalars_ + sinv_slot(DY));
    quantize(X, scratch_.xq, x, N, in, true, scalars_ + sinv_slot(X));
    GemmEx g =
        gemm_of(false, true, out, in, N, gt, scratch_.dyq, DType::F8E4M3, scratch_.xq, dw, 1.f);
    g.a_scale = scalars_ + sinv_slot(DY);
    g.b_scale = scalars_ + sinv_slot(X);
    be_.gemm_ex(g);
  }
  if (db != nullptr) be_.matmul_backward(nullptr, nullptr, db, dy, x, w, N, in, out);
}

// MXFP8: blocks along each GEMM's reduction dimension, as the CPU recipe quantises them: the
// forward along `in` (x and W), dx along `out` (dy by rows' columns, W down its columns), dW
// along the tokens (dy and x down their columns); bf16 GEMMs with fp32 accumulation.
void CudaFp8Linear::mx_forward(float* y, const float* x, const float* w, int N, int in, int out,
                               float beta) {
  auto st = static_cast<cudaStream_t>(be_.stream());
  auto* xq = static_cast<uint16_t*>(scratch_.xq);
  auto* wq = static_cast<uint16_t*>(scratch_.wq);
  cuda::mx_dequantize(st, xq, false, x, N, in, false);
  cuda::mx_dequantize(st, wq, false, w, out, in, false);
  GemmEx g = gemm_of(false, true, N, out, in, DType::BF16, xq, DType::BF16, wq, y, beta);
  be_.gemm_ex(g);
}

void CudaFp8Linear::mx_backward(float* dx, float* dw, const float* dy, const float* x,
                                const float* w, int N, int in, int out) {
  auto st = static_cast<cudaStream_t>(be_.stream());
  auto* xq = static_cast<uint16_t*>(scratch_.xq);
  auto* dyq = static_cast<uint16_t*>(scratch_.dyq);
  auto* wq = static_cast<uint16_t*>(scratch_.wq);
  if (dx != nullptr) {  // dx[N, in] = dy[N, out] W[out, in]
    cuda::mx_dequantize(st, dyq, opt_.hybrid, dy, N, out, false);
    cuda::mx_dequantize(st, wq, false, w, out, in, true);
    GemmEx g = gemm_of(false, false, N, in, out, DType::BF16, dyq, DType::BF16, wq, dx, 0.f);
    be_.gemm_ex(g);
  }
  if (dw != nullptr) {  // dW[out, in] += dy^T x
    cuda::mx_dequantize(st, dyq, opt_.hybrid, dy, N, out, true);
    cuda::mx_dequantize(st, xq, false, x, N, in, true);
    GemmEx g = gemm_of(true, false, out, in, N, DType::BF16, dyq, DType::BF16, xq, dw, 1.f);
    be_.gemm_ex(g);
  }
}

}  // namespace loom
