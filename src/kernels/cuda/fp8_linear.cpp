#include "kernels/cuda/fp8_linear.h"

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "kernels/cuda/kernels.h"

namespace loom {
namespace {
// Slots of scalars_ (floats, 16 bytes apart): cuBLASLt refuses unaligned scale pointers.
constexpr int kAmax = 0, kSinvX = 4, kSinvW = 8, kSinvDy = 12, kScalars = 16;
}  // namespace

CudaFp8Linear::CudaFp8Linear(CudaBackend& be, bool hybrid, int margin, int max_tokens,
                             int max_features, size_t max_weight)
    : be_(be),
      hybrid_(hybrid),
      margin_(margin),
      max_tokens_(max_tokens),
      max_features_(max_features),
      max_weight_(max_weight) {
  LOOM_CHECK(be.sm_version() >= 89, "fp8 linear layers need fp8 tensor cores (sm_89 or newer); ",
             be.device_name(), " is sm_", be.sm_version(),
             ": use precision.fp8_recipe = \"none\" or mxfp8 emulation there");
  LOOM_CHECK(margin >= 0 && margin <= 30, "fp8 margin ", margin, " outside [0, 30]");
  // One allocation for the layer's life (not from the arena: its classes are committed once,
  // and tests build several layers on one backend).
  const size_t act = align_up(size_t(max_tokens) * size_t(max_features), 256);
  const size_t bytes = 2 * act + align_up(max_weight, 256) + kScalars * sizeof(float);
  LOOM_CHECK(cudaMalloc(&mem_, bytes) == cudaSuccess, "fp8 linear (cuda): cannot allocate ",
             bytes >> 20, " MiB of scratch");
  auto* base = static_cast<uint8_t*>(mem_);
  xq_ = base;
  dyq_ = base + act;
  wq_ = base + 2 * act;
  scalars_ = reinterpret_cast<float*>(base + 2 * act + align_up(max_weight, 256));
}

CudaFp8Linear::~CudaFp8Linear() {
  cudaFree(mem_);
}

void CudaFp8Linear::check(int N, int in, int out) const {
  LOOM_CHECK(N % 16 == 0 && in % 16 == 0 && out % 16 == 0,
             "fp8 linear (cuda): tokens, in and out must be multiples of 16 (got N=", N, " in=", in,
             " out=", out, ")");
  LOOM_CHECK(N <= max_tokens_ && in <= max_features_ && out <= max_features_ &&
                 size_t(in) * size_t(out) <= max_weight_,
             "fp8 linear (cuda): layer ", N, "x", in, "->", out, " exceeds the scratch sized for ",
             max_tokens_, " tokens, ", max_features_, " features");
}

void CudaFp8Linear::quantize(void* dst, bool e5m2, const float* v, int rows, int cols,
                             bool transpose, float* sinv) {
  auto st = static_cast<cudaStream_t>(be_.stream());
  cuda::fp8_amax(st, v, int64_t(rows) * cols, scalars_ + kAmax);
  cuda::fp8_quantize(st, dst, e5m2, v, rows, cols, transpose, scalars_ + kAmax, margin_, sinv);
}

void CudaFp8Linear::forward(float* y, const float* x, const float* w, const float* b, int N, int in,
                            int out) {
  if (N == 0 || out == 0) return;
  check(N, in, out);
  quantize(xq_, false, x, N, in, false, scalars_ + kSinvX);
  quantize(wq_, false, w, out, in, false, scalars_ + kSinvW);
  if (b != nullptr) cuda::set_rows(static_cast<cudaStream_t>(be_.stream()), y, b, N, out);
  GemmEx g;
  g.trans_b = true;
  g.M = N;
  g.N = out;
  g.K = in;
  g.a_type = g.b_type = DType::F8E4M3;
  g.c_type = DType::F32;
  g.A = xq_;
  g.lda = in;
  g.B = wq_;
  g.ldb = in;
  g.C = y;
  g.ldc = out;
  g.beta = b != nullptr ? 1.f : 0.f;  // y seeded with the bias
  g.a_scale = scalars_ + kSinvX;
  g.b_scale = scalars_ + kSinvW;
  be_.gemm_ex(g);
}

void CudaFp8Linear::backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                             const float* w, int N, int in, int out) {
  if (N == 0) return;
  check(N, in, out);
  const DType gt = hybrid_ ? DType::F8E5M2 : DType::F8E4M3;
  if (dx != nullptr) {  // dx[N, in] = dy[N, out] W[out, in]: B is W^T stored [in, out]
    quantize(dyq_, hybrid_, dy, N, out, false, scalars_ + kSinvDy);
    quantize(wq_, false, w, out, in, true, scalars_ + kSinvW);
    GemmEx g;
    g.trans_b = true;
    g.M = N;
    g.N = in;
    g.K = out;
    g.a_type = gt;
    g.b_type = DType::F8E4M3;
    g.c_type = DType::F32;
    g.A = dyq_;
    g.lda = out;
    g.B = wq_;
    g.ldb = out;
    g.C = dx;
    g.ldc = in;
    g.a_scale = scalars_ + kSinvDy;
    g.b_scale = scalars_ + kSinvW;
    be_.gemm_ex(g);
  }
  if (dw != nullptr) {  // dW[out, in] += dy^T x: A = dy^T [out, N], B = x^T stored [in, N]
    quantize(dyq_, hybrid_, dy, N, out, true, scalars_ + kSinvDy);
    quantize(xq_, false, x, N, in, true, scalars_ + kSinvX);
    GemmEx g;
    g.trans_b = true;
    g.M = out;
    g.N = in;
    g.K = N;
    g.a_type = gt;
    g.b_type = DType::F8E4M3;
    g.c_type = DType::F32;
    g.A = dyq_;
    g.lda = N;
    g.B = xq_;
    g.ldb = N;
    g.C = dw;
    g.ldc = in;
    g.beta = 1.f;
    g.a_scale = scalars_ + kSinvDy;
    g.b_scale = scalars_ + kSinvX;
    be_.gemm_ex(g);
  }
  if (db != nullptr) be_.matmul_backward(nullptr, nullptr, db, dy, x, w, N, in, out);
}

}  // namespace loom
