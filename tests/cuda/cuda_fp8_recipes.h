// The fp8 recipes on the GPU in the real Decoder's Linear slots, as precision/fp8_recipes.h's
// Fp8Recipes attaches the CPU ones: one CudaFp8Linear (its own scaling state) per block linear
// layer, the head left as it is, one shared scratch for the codes. Used by the GPU step tests
// and bench_cuda.
//
// Delayed scaling: begin_step() before each training step (after the previous optimizer step)
// rolls the amaxes recorded since the last call into the histories, as Fp8Recipes::begin_step;
// forward-only passes (forward_loss, forward_logits) between steps run inside set_recording
// (false), so the histories hold training steps only.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/cuda/fp8_linear.h"
#include "model/decoder.h"
#include "model/linear.h"

namespace loom::test {

class CudaFp8Recipes {
 public:
  // Attaches to every block linear of `model` (a Decoder on `be`), for micro-batches of up to
  // max_tokens tokens.
  CudaFp8Recipes(Decoder& model, CudaBackend& be, const CudaFp8Options& o, int max_tokens)
      : be_(be), scratch_(make_scratch(model, o, max_tokens)) {
    for (const Decoder::LinearInfo& l : model.linears()) {
      if (l.name == "head") continue;  // the head stays in the backend's GEMMs (as on the CPU)
      layers_.push_back(std::make_unique<Layer>(*this, o));
      names_.push_back(l.name);
      model.attach_recipe(l.name, layers_.back().get());
    }
  }
  CudaFp8Recipes(const CudaFp8Recipes&) = delete;
  CudaFp8Recipes& operator=(const CudaFp8Recipes&) = delete;

  void begin_step() {
    for (auto& l : layers_) l->lin.begin_step();
  }
  void set_recording(bool on) {
    for (auto& l : layers_) l->lin.set_recording(on);
  }
  size_t size() const { return layers_.size(); }
  const std::string& name(size_t i) const { return names_.at(i); }
  // Layer i's scaling state (delayed scaling's scales: CudaFp8Linear::scale, a download).
  const CudaFp8Linear& linear(size_t i) const { return layers_.at(i)->lin; }
  // Called with "fp8 linear" before each layer's forward and backward (a profiler's marks: the
  // layers run their kernels on the CUDA backend directly). Null: none.
  std::function<void(const char*)> mark;

 private:
  // One linear layer's recipe. The fp8 kernels read fp32 activations: a bf16-stored input is
  // widened into a buffer of the backend first (exact).
  struct Layer : GemmRecipe {
    Layer(CudaFp8Recipes& r, const CudaFp8Options& o) : owner(r), lin(r.be_, o, *r.scratch_) {}
    const float* fp32(ActIn x, int64_t n) {
      if (x.f32) return x.f32;
      float* s = owner.widen_.ensure_n<float>(owner.be_, size_t(n), "scratch");
      owner.be_.convert(s, DType::F32, x.bf16, DType::BF16, n);
      return s;
    }
    void forward(Backend&, float* y, ActIn x, const float* w, const float* b, int N, int in,
                 int out) override {
      if (owner.mark) owner.mark("fp8 linear");
      lin.forward(y, fp32(x, int64_t(N) * in), w, b, N, in, out);
    }
    void backward(Backend&, float* dx, float* dw, float* db, const float* dy, ActIn x,
                  const float* w, int N, int in, int out) override {
      if (owner.mark) owner.mark("fp8 linear");
      lin.backward(dx, dw, db, dy, fp32(x, int64_t(N) * in), w, N, in, out);
    }
    CudaFp8Recipes& owner;
    CudaFp8Linear lin;
  };

  static std::unique_ptr<CudaFp8Scratch> make_scratch(const Decoder& m, const CudaFp8Options& o,
                                                      int max_tokens) {
    int widest = 0;
    size_t weight = 0;
    for (const Decoder::LinearInfo& l : m.linears()) {
      if (l.name == "head") continue;
      widest = std::max({widest, l.in, l.out});
      weight = std::max(weight, size_t(l.in) * size_t(l.out));
    }
    return std::make_unique<CudaFp8Scratch>(max_tokens, widest, weight, o.mx ? 2 : 1);
  }

  CudaBackend& be_;
  std::unique_ptr<CudaFp8Scratch> scratch_;
  BackendBuffer widen_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::string> names_;
};

}  // namespace loom::test
