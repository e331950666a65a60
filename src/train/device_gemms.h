// The reduced-precision policies' GEMMs on a backend whose memory the host cannot touch (a GPU).
// Linear's own fp32 path widens bf16-stored activations into a host scratch vector, which device
// memory does not allow; this recipe widens them into a Backend buffer instead (Backend::convert)
// and runs the backend's fp32 GEMM ops on the same values: bit for bit what Linear does on the
// CPU without a recipe (tested over the guarded backend).
//
// On CUDA the trainer sets the GEMM math to the policy's type (bf16, fp16): the weights (rounded
// from the fp32 master after each step) and stored activations are values of that type already,
// and output gradients are rounded to it for the product, as the CPU's oneDNN bf16 GEMMs do
// (precision/bf16_gemms.h); fp32 accumulation.
#pragma once

#include <memory>

#include "kernels/buffer.h"
#include "model/decoder.h"
#include "model/linear.h"

namespace loom {

class DeviceGemms : public GemmRecipe {
 public:
  void forward(Backend& be, float* y, ActIn x, const float* w, const float* b, int N, int in,
               int out) override;
  void backward(Backend& be, float* dx, float* dw, float* db, const float* dy, ActIn x,
                const float* w, int N, int in, int out) override;

 private:
  const float* widened(Backend& be, ActIn x, int64_t n);
  // The widened input, reused from call to call (stream-ordered on a GPU: the GEMM that reads
  // it runs before the next widening writes it).
  BackendBuffer scratch_;
};

// Attaches one DeviceGemms to every linear layer of `model`; the caller keeps it alive.
std::unique_ptr<DeviceGemms> attach_device_gemms(Decoder& model);

}  // namespace loom
