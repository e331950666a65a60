// The model's one linear layer, y[N, out] = x[N, in] W^T + b: every matmul of the decoder's
// blocks and head goes through Linear, so that what later work attaches to a linear layer has
// one place to go:
//   - an adapter (LoRA: y += B A x * scale), with its own parameters and gradients;
//   - a GEMM recipe (bf16, FP8 / MXFP8: quantised inputs), which replaces the matmul itself.
// Both are applied from outside the model (Decoder::attach_adapter / attach_recipe) by name.
// Shapes are local: under tensor parallelism a column- or row-parallel layer is a Linear of its
// shard, and forward/backward carry the communication at its edges (Megatron's f and g, SP's
// all-gather and reduce-scatter) through TensorParallelOps (model/parallel_ops.h), which
// parallel/tensor_parallel.cpp implements: the caller's code is the same on one rank.
//
// The input x is typed (ActIn): the bf16 precision policy stores activations in bf16, two
// bytes per value, and a bf16 recipe reads them as they are; the fp32 paths (no recipe, an
// adapter) widen them first, which is exact.
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"

namespace loom {

// A read-only activation buffer as stored: fp32, or bf16 (uint16_t bit patterns as
// core/dtype.h's f32_to_bf16 writes them). Exactly one pointer is set.
struct ActIn {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  ActIn() = default;
  ActIn(const float* p) : f32(p) {}      // NOLINT: fp32 call sites read as before
  ActIn(const uint16_t* p) : bf16(p) {}  // NOLINT
  // The view `offset` elements further on.
  ActIn at(int64_t offset) const { return f32 ? ActIn(f32 + offset) : ActIn(bf16 + offset); }
  // fp32 values of elements [0, n): the buffer itself, or a copy widened by `be` into `scratch`
  // (resized).
  const float* widened(Backend& be, int64_t n, std::vector<float>& scratch) const;
};

// A writable activation buffer as the precision policy stores it: fp32, or bf16 (two bytes per
// value really stored). Exactly one pointer is set.
struct ActBuf {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  ActIn in(int64_t offset = 0) const { return f32 ? ActIn(f32 + offset) : ActIn(bf16 + offset); }
};

class TensorParallelOps;

class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  // y[N, out] += adapter(x[N, in]). first_row: the index of x's first row among the micro-
  // batch's tokens (the head runs over row chunks), for what depends on a token's place in the
  // micro-batch (LoRA dropout's mask).
  virtual void forward(Backend& be, float* y, const float* x, int N, int first_row) = 0;
  // dx[N, in] += the adapter's input gradient (dx nullable: not needed); accumulates the
  // adapter's own parameter gradients.
  virtual void backward(Backend& be, float* dx, const float* dy, const float* x, int N,
                        int first_row) = 0;
};

// How the layer's GEMMs are computed (precision recipes: quantise x, W and dy on the way in).
// Same contract as Backend::matmul_forward / matmul_backward, weight gradient included, with x
// as stored (fp32 or bf16).
class GemmRecipe {
 public:
  virtual ~GemmRecipe() = default;
  virtual void forward(Backend& be, float* y, ActIn x, const float* w, const float* b, int N,
                       int in, int out) = 0;
  virtual void backward(Backend& be, float* dx, float* dw, float* db, const float* dy, ActIn x,
                        const float* w, int N, int in, int out) = 0;
  // Where the caller may leave dy's bf16 bits (n elements) while it rounds dy to bf16 in place
  // just before backward() with this dy: one pass over dy instead of a rounding pass and the
  // recipe's own conversion. The note lasts until the recipe's next forward() or backward().
  // nullptr (the default): the recipe reads dy as it does without a note.
  virtual uint16_t* dy_bits(const float* dy, int64_t n) {
    (void)dy;
    (void)n;
    return nullptr;
  }
  // Whether forward_bf16 / backward_bf16 are provided: a layer without bias or adapter whose
  // output the caller keeps as bf16 bits (the bf16 head's logits) is written by the GEMM as
  // bf16 (round to nearest even of the fp32 sums) and its gradient read as bf16 bits, with no
  // fp32 pass over it in between.
  virtual bool bf16_outputs() const { return false; }
  virtual void forward_bf16(Backend& be, uint16_t* y, ActIn x, const float* w, int N, int in,
                            int out) {
    (void)be, (void)y, (void)x, (void)w, (void)N, (void)in, (void)out;
    LOOM_CHECK(false, "this GEMM recipe does not write bf16 outputs");
  }
  // backward() without db, dy given as bf16 bits.
  virtual void backward_bf16(Backend& be, float* dx, float* dw, const uint16_t* dy, ActIn x,
                             const float* w, int N, int in, int out) {
    (void)be, (void)dx, (void)dw, (void)dy, (void)x, (void)w, (void)N, (void)in, (void)out;
    LOOM_CHECK(false, "this GEMM recipe does not read bf16 output gradients");
  }
};

struct Linear {
  // How the layer is split over the tensor-parallel group: not at all, by output features
  // (column: the input is replicated, or gathered along tokens under SP; its gradient is summed
  // over the group) or by input features (row: the output is a partial sum, reduced over the
  // group, or reduce-scattered along tokens under SP).
  enum class Split { None, Column, Row };
  const float* w = nullptr;  // [out, in]
  const float* b = nullptr;  // [out], nullable
  float* dw = nullptr;       // gradients: nullptr when frozen (the GEMM is skipped)
  float* db = nullptr;
  int in = 0, out = 0;
  LinearAdapter* adapter = nullptr;
  GemmRecipe* recipe = nullptr;
  int first_row = 0;  // x's first row within the micro-batch (passed to the adapter)
  Split split = Split::None;
  TensorParallelOps* tp = nullptr;  // the group's edges (null: one rank)
  // Where the fp32 paths (no recipe, an adapter) widen a bf16-stored input: a buffer of the
  // model's backend, so that the GEMM reads device memory on a GPU (the Decoder's). Null: a
  // host vector, which only a host-accessible backend can take.
  BackendBuffer* widen = nullptr;

  // The layer with its edges, over N tokens. Column: x [N, in] holds this rank's rows (SP) and
  // is gathered in place first; y [N, out] is written for every row. Row: y is the partial
  // product (bias on one rank) summed over the group. Returns this rank's rows of y (y itself,
  // or the TP ops' scratch under SP).
  float* forward(Backend& be, float* y, const ActBuf& x, int N) const;
  // dy: this rank's rows of the output gradient (gathered first under SP for a row-parallel
  // layer). dx (written, nullable) = dy W, summed over the group for a column-parallel layer.
  // dw += dy^T x; db += sum dy; plus the adapter's share. Returns this rank's rows of dx.
  float* backward(Backend& be, float* dx, const float* dy, ActIn x, int N) const;

  // The edges alone, for a layer run over row chunks (the output head): the column-parallel
  // input's gather, and its input gradient's sum (returns this rank's rows).
  void gather_input(const ActBuf& x, int N) const;
  float* reduce_input_grad(float* dx, int N) const;
  // One shard's computation without the edges: y = x W^T + b (+ adapter), and its backward.
  void local_forward(Backend& be, float* y, ActIn x, int N) const;
  void local_backward(Backend& be, float* dx, const float* dy, ActIn x, int N) const;
  // The same with y and dy as bf16 bits, where bf16_outputs(): a recipe that provides them,
  // no bias and no adapter (the bf16 head).
  bool bf16_outputs() const { return recipe && recipe->bf16_outputs() && !b && !db && !adapter; }
  void local_forward_bf16(Backend& be, uint16_t* y, ActIn x, int N) const;
  void local_backward_bf16(Backend& be, float* dx, const uint16_t* dy, ActIn x, int N) const;

 private:
  // x's fp32 values over N rows: x itself, or widened into `widen` (or the host scratch).
  const float* fp32_input(Backend& be, ActIn x, int N) const;
};

}  // namespace loom
