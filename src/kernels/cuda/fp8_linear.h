// A linear layer with per-tensor current scaling in fp8 on the GPU (Transformer Engine's
// Float8CurrentScaling; Loom's `fp8_tensorwise_current` recipe, precision/fp8_recipes.h), with
// the CPU recipe's arithmetic: x and W quantised to e4m3, dy to e4m3 or (hybrid) e5m2, each
// with scale = fmt_max / amax / 2^margin; the three GEMMs on cuBLASLt's fp8 tensor cores with
// the inverse scales as scale pointers; the bias and its gradient in fp32.
//   forward   y  = (1/sx)(1/sw) q(x) q(W)^T + b
//   backward  dx = (1/sdy)(1/sw) q(dy) q(W),   dW += (1/sdy)(1/sx) q(dy)^T q(x),   db += sum dy
// Hopper's fp8 GEMMs take only A[M,K] x B[N,K]^T (TN), so the backward GEMMs read transposed
// copies of the codes, quantised transposed in the same pass (TE's cast-transpose).
// Shapes: N (tokens), in and out multiples of 16 (cuBLASLt's fp8 alignment).
#pragma once

#include <cstddef>

#include "kernels/cuda/cuda_backend.h"

namespace loom {

class CudaFp8Linear {
 public:
  // Scratch for layers up to max_tokens x max(in, out) activations and max_weight weights,
  // allocated once (device memory owned by the layer).
  CudaFp8Linear(CudaBackend& be, bool hybrid, int margin, int max_tokens, int max_features,
                size_t max_weight);
  ~CudaFp8Linear();
  CudaFp8Linear(const CudaFp8Linear&) = delete;
  CudaFp8Linear& operator=(const CudaFp8Linear&) = delete;

  void forward(float* y, const float* x, const float* w, const float* b, int N, int in, int out);
  // dx and db nullable; dW accumulates.
  void backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                int N, int in, int out);

 private:
  void check(int N, int in, int out) const;
  // Codes of v [rows, cols] (transposed when asked) with v's own current scale; the inverse
  // scale goes to the device float at `sinv`.
  void quantize(void* dst, bool e5m2, const float* v, int rows, int cols, bool transpose,
                float* sinv);

  CudaBackend& be_;
  bool hybrid_;
  int margin_, max_tokens_, max_features_;
  size_t max_weight_;
  void* mem_ = nullptr;
  void *xq_, *dyq_, *wq_;  // codes: activations (x or x^T), gradients (dy or dy^T), weights
  float* scalars_;         // amax and inverse scales, each on its own 16-byte line
};

}  // namespace loom
