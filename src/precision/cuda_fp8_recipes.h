// The fp8 recipes on the GPU in the Decoder's Linear slots, as Fp8Recipes attaches the CPU ones
// (precision/fp8_recipes.h): one CudaFp8Linear (its own scaling state) per selected linear
// (fp8_layer_names: the block linears but the kept blocks', never the head), one shared scratch
// for the codes. Built with the CUDA backend only; the Trainer reaches it through
// precision/device_fp8.h, the GPU tests and bench_cuda directly.
//
// Delayed scaling: every layer's scales, pending amaxes and histories live in one
// DeviceFp8Scaling (precision/device_fp8_scaling.h; Backend ops, tested against the CPU recipe
// on the CPU and guarded backends). begin_step() before each training step (after the previous
// optimizer step) max-reduces the amaxes recorded since the last call over the amax group and
// rolls them into the histories, as Fp8Recipes::begin_step; forward-only passes between steps
// run inside set_recording(false), so the histories hold training steps only; state() /
// restore() checkpoint them in the CPU recipe's format. Current scaling max-reduces every amax
// over the TP group when one is set. The weights are quantised on every call (no cached copy),
// so there is nothing to refresh after an optimizer step or a checkpoint load.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/cuda/fp8_linear.h"
#include "model/decoder.h"
#include "model/linear.h"
#include "precision/device_fp8.h"
#include "precision/device_fp8_scaling.h"
#include "precision/fp8_recipes.h"

namespace loom {

// The GPU layer options of a recipe read from the [precision] keys.
CudaFp8Options cuda_fp8_options(const Fp8Options& o);

class CudaFp8Recipes : public DeviceFp8Recipes {
 public:
  // Attaches to the linears of `model` (a Decoder on `be`) that fp8_layer_names(model, keep)
  // selects (keep: keep_first / keep_last; the rest of it is ignored here), for micro-batches
  // of up to max_tokens tokens.
  CudaFp8Recipes(Decoder& model, CudaBackend& be, const CudaFp8Options& o, int max_tokens,
                 const Fp8Options& keep = Fp8Options{});
  ~CudaFp8Recipes() override;
  CudaFp8Recipes(const CudaFp8Recipes&) = delete;
  CudaFp8Recipes& operator=(const CudaFp8Recipes&) = delete;

  void begin_step() override;
  void set_recording(bool on) override;
  size_t size() const override { return layers_.size(); }
  bool delayed() const override { return delayed_; }
  const std::string& name(size_t i) const override { return names_.at(i); }
  void set_amax_group(comm::Communicator* g) override { amax_group_ = g; }
  void set_tp_group(comm::Communicator* g) override;
  Json state() const override;
  void restore(const Json* j, const std::string& where) override;
  // Layer i's scaling state (delayed scaling's scales: CudaFp8Linear::scale, a download).
  const CudaFp8Linear& linear(size_t i) const;
  // Delayed scaling's state of every layer (nullptr for the other recipes).
  const DeviceFp8Scaling* scaling() const { return scaling_.get(); }
  // Called with "fp8 linear" before each layer's forward and backward (a profiler's marks: the
  // layers run their kernels on the CUDA backend directly). Null: none.
  std::function<void(const char*)> mark;

 private:
  struct Layer;
  // The fp8 kernels read fp32 activations: a bf16-stored input is widened into a buffer of the
  // backend first (exact).
  const float* fp32(ActIn x, int64_t n);

  CudaBackend& be_;
  bool delayed_;
  std::unique_ptr<DeviceFp8Scaling> scaling_;  // delayed scaling
  comm::Communicator* amax_group_ = nullptr;
  std::unique_ptr<CudaFp8Scratch> scratch_;
  BackendBuffer widen_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::string> names_;
};

}  // namespace loom
