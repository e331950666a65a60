// The fp8 recipes on the guarded CPU backend (tests/kernels/guarded_backend.h), standing in for
// the GPU recipe (precision/cuda_fp8_recipes.h) where no GPU is: registered with
// set_device_fp8_stand_in, the Trainer on the guarded backend attaches it as it attaches
// CudaFp8Recipes on a GPU, so the trainer's device fp8 wiring runs without one: the layers each
// pipeline stage selects, delayed scaling's state in a DeviceFp8Scaling on the device (its
// amaxes recorded by Backend ops, max-reduced over the stage's amax group through the device
// communicator, rolled by fp8_roll_history), begin_step, unrecorded evaluation, and the state
// in each rank's checkpoint and its restore.
//
// The GEMMs are the CPU recipe's own (an Fp8Linear per layer, run as one guarded host op with
// the device's current scales loaded into it): the CUDA kernels are not what this tests (they
// have their own tests in tests/cuda), only that the device state and wiring around them give
// the CPU trainer's results bit for bit. Current scaling under TP is not emulated (its amax
// reduction is inside the CUDA layer's quantisation): refused by set_tp_group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/buffer.h"
#include "kernels/guarded_backend.h"
#include "precision/device_fp8.h"
#include "precision/device_fp8_scaling.h"
#include "precision/fp8_recipes.h"

namespace loom::test {

class GuardedFp8Recipes : public DeviceFp8Recipes {
 public:
  // What a test checks ran: GEMM calls through the stand-ins and their begin_step calls.
  struct Counts {
    int64_t gemms = 0, steps = 0, recipes = 0;
  };

  GuardedFp8Recipes(const Fp8Options& o, Decoder& model, GuardedBackend& g, Counts* counts)
      : g_(g), opt_(o), names_(fp8_layer_names(model, o)), counts_(counts) {
    ++counts_->recipes;
    if (delayed()) scaling_ = std::make_unique<DeviceFp8Scaling>(g, o, names_);
    for (size_t i = 0; i < names_.size(); ++i) {
      layers_.push_back(std::make_unique<Layer>(*this, i));
      model.attach_recipe(names_[i], layers_.back().get());
    }
  }

  // Registers the stand-in for `g` for the scope of this object (a test's), counting into
  // `counts`.
  struct Registration {
    Counts counts;
    explicit Registration(GuardedBackend& g) {
      set_device_fp8_stand_in(&g, [&g, c = &counts](const Fp8Options& o, Decoder& m, Backend&) {
        return std::make_unique<GuardedFp8Recipes>(o, m, g, c);
      });
    }
    ~Registration() { set_device_fp8_stand_in(nullptr, nullptr); }
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
  };

  void begin_step() override {
    ++counts_->steps;
    if (scaling_) scaling_->begin_step(amax_group_);
  }
  void set_recording(bool on) override {
    if (scaling_) scaling_->set_recording(on);
  }
  size_t size() const override { return names_.size(); }
  bool delayed() const override { return opt_.kind == Fp8RecipeKind::TensorwiseDelayed; }
  const std::string& name(size_t i) const override { return names_.at(i); }
  void set_amax_group(comm::Communicator* g) override { amax_group_ = g; }
  void set_tp_group(comm::Communicator* g) override {
    LOOM_CHECK(g == nullptr || g->size() == 1,
               "guarded fp8 stand-in: current scaling under tensor parallelism is not emulated");
  }
  Json state() const override { return scaling_ ? scaling_->state() : Json(); }
  void restore(const Json* j, const std::string& where) override {
    if (scaling_) scaling_->restore(j, where);
  }

 private:
  struct Layer : GemmRecipe {
    Layer(GuardedFp8Recipes& r, size_t i) : owner(r), index(i), lin(r.opt_, nullptr) {
      lin.set_recording(false);  // the device state records the amaxes
    }
    void forward(Backend&, float* y, ActIn x_in, const float* w, const float* b, int N, int in,
                 int out) override {
      const float* x = owner.fp32(x_in, int64_t(N) * in);
      owner.record(index, Fp8Linear::X, x, int64_t(N) * in);
      owner.record(index, Fp8Linear::W, w, int64_t(in) * out);
      load_scales();
      owner.g_.host_op("fp8 linear (stand-in)", {y, x, w, b}, [&] {
        lin.new_weights();  // as the GPU layer: the weights quantised on every call
        lin.forward(cpu_backend(), y, x, w, b, N, in, out);
      });
      ++owner.counts_->gemms;
    }
    void backward(Backend&, float* dx, float* dw, float* db, const float* dy, ActIn x_in,
                  const float* w, int N, int in, int out) override {
      const float* x = owner.fp32(x_in, int64_t(N) * in);
      owner.record(index, Fp8Linear::DY, dy, int64_t(N) * out);
      owner.record(index, Fp8Linear::W, w, int64_t(in) * out);
      load_scales();
      owner.g_.host_op("fp8 linear backward (stand-in)", {dx, dw, db, dy, x, w}, [&] {
        lin.new_weights();
        lin.backward(cpu_backend(), dx, dw, db, dy, x, w, N, in, out);
      });
      ++owner.counts_->gemms;
    }
    // Delayed scaling: the step's scales, as the device holds them, into the CPU layer.
    void load_scales() {
      if (!owner.scaling_) return;
      float s[3];
      owner.g_.copy_d2h(s, owner.scaling_->scales(index), sizeof s);
      Json j = Json::array();
      for (float v : s) j.push_back(Fp8Linear::tensor_state(v, {}, nullptr));
      lin.restore(j, "guarded fp8 stand-in");
    }
    GuardedFp8Recipes& owner;
    size_t index;
    Fp8Linear lin;
  };

  void record(size_t i, int t, const float* v, int64_t n) {
    if (scaling_) scaling_->record(i, t, v, n);
  }
  const float* fp32(ActIn x, int64_t n) {
    if (x.f32) return x.f32;
    float* s = widen_.ensure_n<float>(g_, size_t(n), "scratch");
    g_.convert(s, DType::F32, x.bf16, DType::BF16, n);
    return s;
  }

  GuardedBackend& g_;
  Fp8Options opt_;
  std::vector<std::string> names_;
  std::unique_ptr<DeviceFp8Scaling> scaling_;
  comm::Communicator* amax_group_ = nullptr;
  std::vector<std::unique_ptr<Layer>> layers_;
  BackendBuffer widen_;
  Counts* counts_;
};

}  // namespace loom::test
