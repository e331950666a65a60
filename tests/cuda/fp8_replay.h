// The blocks' linear layers of a StepReplay in fp8 on the GPU, as Fp8Recipes attaches them to
// the Decoder on the CPU: one CudaFp8Linear (its own scaling state) per weight, one shared
// scratch for the codes. Used by the GPU step tests and bench_cuda.
#pragma once

#include <algorithm>
#include <map>
#include <memory>

#include "cuda/step_replay.h"
#include "kernels/cuda/fp8_linear.h"
#include "model/model_config.h"

namespace loom::test {

class Fp8Layers {
 public:
  Fp8Layers(CudaBackend& be, const CudaFp8Options& o, const ModelConfig& cfg, int tokens)
      : be_(be),
        opt_(o),
        scratch_(tokens, widest(cfg), size_t(widest(cfg)) * std::max(cfg.d_model, cfg.d_ff),
                 o.mx ? 2 : 1) {}

  void attach(StepReplay& r) {
    r.linear.forward = [this](float* y, const float* x, const float* w, const float* b, int n,
                              int in, int out) { layer(w).forward(y, x, w, b, n, in, out); };
    r.linear.backward = [this](float* dx, float* dw, float* db, const float* dy, const float* x,
                               const float* w, int n, int in,
                               int out) { layer(w).backward(dx, dw, db, dy, x, w, n, in, out); };
  }
  // A new training step for every layer (delayed scaling rolls its histories).
  void begin_step() {
    for (auto& [w, l] : layers_) l->begin_step();
  }

 private:
  static int widest(const ModelConfig& c) {
    return std::max({c.d_model, c.qkv_dim(), c.fc_dim(), c.d_ff});
  }
  CudaFp8Linear& layer(const float* w) {
    auto& l = layers_[w];
    if (!l) l = std::make_unique<CudaFp8Linear>(be_, opt_, scratch_);
    return *l;
  }

  CudaBackend& be_;
  CudaFp8Options opt_;
  CudaFp8Scratch scratch_;
  std::map<const float*, std::unique_ptr<CudaFp8Linear>> layers_;
};

}  // namespace loom::test
