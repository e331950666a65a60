// The model's one linear layer, y[N, out] = x[N, in] W^T + b: every matmul of the decoder's
// blocks and head goes through Linear, so that what later work attaches to a linear layer has
// one place to go:
//   - an adapter (LoRA: y += B A x * scale), with its own parameters and gradients;
//   - a GEMM recipe (FP8 / MXFP8: quantised inputs), which replaces the matmul itself.
// Both are applied from outside the model (Decoder::attach_adapter / attach_recipe) by name.
// Shapes are local: under tensor parallelism a column- or row-parallel layer is a Linear of its
// shard, and the communication at its edges stays with the caller.
#pragma once

#include "kernels/backend.h"

namespace loom {

class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  // y[N, out] += adapter(x[N, in]).
  virtual void forward(Backend& be, float* y, const float* x, int N) = 0;
  // dx[N, in] += the adapter's input gradient (dx nullable: not needed); accumulates the
  // adapter's own parameter gradients.
  virtual void backward(Backend& be, float* dx, const float* dy, const float* x, int N) = 0;
};

// How the layer's GEMMs are computed (precision recipes: quantise x, W and dy on the way in).
// Same contract as Backend::matmul_forward / matmul_backward, weight gradient included.
class GemmRecipe {
 public:
  virtual ~GemmRecipe() = default;
  virtual void forward(Backend& be, float* y, const float* x, const float* w, const float* b, int N,
                       int in, int out) = 0;
  virtual void backward(Backend& be, float* dx, float* dw, float* db, const float* dy,
                        const float* x, const float* w, int N, int in, int out) = 0;
};

struct Linear {
  const float* w = nullptr;  // [out, in]
  const float* b = nullptr;  // [out], nullable
  float* dw = nullptr;       // gradients: nullptr when frozen (the GEMM is skipped)
  float* db = nullptr;
  int in = 0, out = 0;
  LinearAdapter* adapter = nullptr;
  GemmRecipe* recipe = nullptr;

  void forward(Backend& be, float* y, const float* x, int N) const {
    if (recipe)
      recipe->forward(be, y, x, w, b, N, in, out);
    else
      be.matmul_forward(y, x, w, b, N, in, out);
    if (adapter) adapter->forward(be, y, x, N);
  }
  // dx (written, nullable) = dy W; dw += dy^T x; db += sum dy; plus the adapter's share.
  void backward(Backend& be, float* dx, const float* dy, const float* x, int N) const {
    if (recipe)
      recipe->backward(be, dx, dw, db, dy, x, w, N, in, out);
    else
      be.matmul_backward(dx, dw, db, dy, x, w, N, in, out);
    if (adapter) adapter->backward(be, dx, dy, x, N);
  }
};

}  // namespace loom
