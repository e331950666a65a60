// A linear layer with per-tensor fp8 scaling on the GPU, Loom's `fp8_tensorwise_current` and
// `fp8_tensorwise_delayed` recipes (precision/fp8_recipes.h; Transformer Engine's
// Float8CurrentScaling and DelayedScaling) with the CPU recipe's arithmetic: x and W quantised
// to e4m3, dy to e4m3 or (hybrid) e5m2, each with scale = fmt_max / amax / 2^margin, where amax
// is the tensor's own (current) or the maximum of an amax history of earlier steps (delayed);
// the three GEMMs on cuBLASLt's fp8 tensor cores with the inverse scales as scale pointers; the
// bias and its gradient in fp32. Scales, amaxes and histories never leave the device.
//   forward   y  = (1/sx)(1/sw) q(x) q(W)^T + b
//   backward  dx = (1/sdy)(1/sw) q(dy) q(W),   dW += (1/sdy)(1/sx) q(dy)^T q(x),   db += sum dy
// Hopper's fp8 GEMMs take only A[M,K] x B[N,K]^T (TN), so the backward GEMMs read transposed
// copies of the codes, quantised transposed in the same pass (TE's cast-transpose).
// Shapes: N (tokens), in and out multiples of 16 (cuBLASLt's fp8 alignment).
#pragma once

#include <cstddef>
#include <functional>

#include "kernels/cuda/cuda_backend.h"

namespace loom {

struct CudaFp8Options {
  bool mx = false;           // MXFP8 (1x32 blocks, E8M0 scales) emulated: dequantised to bf16
                             // for bf16 GEMMs (Hopper has no MX tensor cores), as on the CPU
  bool hybrid = false;       // e5m2 for gradients
  int margin = 0;            // scale = fmt_max / amax / 2^margin
  int amax_history = 0;      // 0: current scaling; > 0: delayed scaling over this many steps
  bool most_recent = false;  // delayed: the newest amax instead of the history's max
};

// The fp8 codes of one layer's operands while its GEMMs run, shared by every layer of a model
// (they run one after another on one stream): layers up to max_tokens x max_features
// activations and max_weight weight elements, `element_bytes` each (1: fp8 codes; 2: MXFP8's
// bf16 values). Device memory owned by this object.
class CudaFp8Scratch {
 public:
  CudaFp8Scratch(int max_tokens, int max_features, size_t max_weight, int element_bytes = 1);
  ~CudaFp8Scratch();
  CudaFp8Scratch(const CudaFp8Scratch&) = delete;
  CudaFp8Scratch& operator=(const CudaFp8Scratch&) = delete;
  void check(int N, int in, int out) const;
  int element_bytes() const { return element_bytes_; }

  void *xq = nullptr, *dyq = nullptr, *wq = nullptr;  // x or x^T, dy or dy^T, W or W^T

 private:
  void* mem_ = nullptr;
  int max_tokens_, max_features_;
  size_t max_weight_;
  int element_bytes_;
};

class CudaFp8Linear {
 public:
  // One layer's scaling state (a few device floats of its own); codes go through `scratch`.
  CudaFp8Linear(CudaBackend& be, const CudaFp8Options& o, CudaFp8Scratch& scratch);
  ~CudaFp8Linear();
  CudaFp8Linear(const CudaFp8Linear&) = delete;
  CudaFp8Linear& operator=(const CudaFp8Linear&) = delete;

  void forward(float* y, const float* x, const float* w, const float* b, int N, int in, int out);
  // dx and db nullable; dW accumulates.
  void backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                int N, int in, int out);

  // Delayed scaling (amax_history > 0): its state lives outside the layer (precision/
  // device_fp8_scaling.h: every layer's in one buffer, so a step's amaxes are max-reduced over
  // the ranks in one all-reduce, rolled into the histories by Backend ops and checkpointed).
  // The quantisations read the scales at `scales` (x, W, dy: three consecutive device floats)
  // and hand each amax they compute (a device float, valid until the next quantisation) to
  // `record` with the tensor's index; the holder decides whether it records (evaluation passes
  // do not). Required before a delayed-scaling layer's first GEMM.
  void use_delayed_state(const float* scales,
                         std::function<void(int tensor, const float* amax)> record);
  // Current scaling across ranks (tensor parallelism, where a tensor is split): called with each
  // tensor's amax (a device float) before its scale is derived, to max-reduce it over the group
  // in place (Transformer Engine's amax reduction), so that every rank quantises with the scale
  // of the whole tensor. Null: the local amax (one rank).
  std::function<void(float* amax)> reduce_amax;
  enum Tensor { X = 0, W = 1, DY = 2 };
  // Delayed: the scale the next GEMM uses (downloads; tests, bench_cuda's trace); current
  // scaling: 1 (its scales are derived per call on the device).
  float scale(Tensor t) const;

 private:
  // Codes of tensor t's values v [rows, cols] (transposed when asked) with its scale (current:
  // from v's amax; delayed: the stored one, v's amax recorded); the inverse scale goes to the
  // device float at `sinv`.
  void quantize(Tensor t, void* dst, const float* v, int rows, int cols, bool transpose,
                float* sinv);
  bool delayed() const { return opt_.amax_history > 0; }
  void mx_forward(float* y, const float* x, const float* w, int N, int in, int out, float beta);
  void mx_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int N,
                   int in, int out);

  CudaBackend& be_;
  CudaFp8Options opt_;
  CudaFp8Scratch& scratch_;
  const float* ext_scales_ = nullptr;  // use_delayed_state
  std::function<void(int, const float*)> ext_record_;
  // The amax of the tensor being quantised and the three inverse scales; 16-byte lines
  float* scalars_ = nullptr;
};

}  // namespace loom
