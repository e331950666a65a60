// The fp8 recipes on the guarded CPU backend (tests/kernels/guarded_backend.h), standing in for
// the GPU recipe (precision/cuda_fp8_recipes.h) where no GPU is: registered with
// set_device_fp8_stand_in, the Trainer on the guarded backend attaches it as it attaches
// CudaFp8Recipes on a GPU, so the trainer's device fp8 wiring runs without one: the layers each
// pipeline stage selects, delayed scaling's state in a DeviceFp8Scaling on the device (its
// amaxes recorded by Backend ops, max-reduced over the stage's amax group through the device
// communicator, rolled by fp8_roll_history), current scaling's amaxes max-reduced over the TP
// group's device communicator, begin_step, unrecorded evaluation, the state in each rank's
// checkpoint and its restore, and the micro-batch size the recipe's scratch is sized for.
//
// The GEMMs are the CPU recipe's own (an Fp8Linear per layer, run as one guarded host op with
// the device's scales loaded into it): the CUDA kernels are not what this tests (they have their
// own tests in tests/cuda), only that the device state and wiring around them give the CPU
// trainer's results bit for bit. Current scaling derives each scale on the device as the CUDA
// layer does: the tensor's amax (Backend::fp8_amax), max-reduced in place over the TP group
// when one is set (CudaFp8Linear::reduce_amax's all-reduce), then the CPU recipe's scale rule
// through the Backend's fp8_roll_history over a history of one. A forward larger than the
// tokens the recipe was attached for is refused as CudaFp8Scratch::check refuses it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
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

  GuardedFp8Recipes(const Fp8Options& o, Decoder& model, GuardedBackend& g, int max_tokens,
                    Counts* counts)
      : g_(g),
        opt_(o),
        names_(fp8_layer_names(model, o)),
        max_tokens_(max_tokens),
        counts_(counts) {
    ++counts_->recipes;
    if (delayed()) scaling_ = std::make_unique<DeviceFp8Scaling>(g, o, names_);
    if (current()) {  // a layer loads all three scales: the ones not yet derived are 1
      const float one[3] = {1.f, 1.f, 1.f};
      g_.copy_h2d(current_floats() + 3 * kPerTensor, one, sizeof one);
    }
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
      set_device_fp8_stand_in(
          &g, [&g, c = &counts](const Fp8Options& o, Decoder& m, Backend&, int max_tokens) {
            return std::make_unique<GuardedFp8Recipes>(o, m, g, max_tokens, c);
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
    LOOM_CHECK(g == nullptr || opt_.kind == Fp8RecipeKind::TensorwiseCurrent,
               "guarded fp8 stand-in: a TP amax group is for current scaling only");
    tp_group_ = g != nullptr && g->size() > 1 ? g : nullptr;
  }
  Json state() const override { return scaling_ ? scaling_->state() : Json(); }
  void restore(const Json* j, const std::string& where) override {
    if (scaling_) scaling_->restore(j, where);
  }

 private:
  struct Layer : GemmRecipe {
    Layer(GuardedFp8Recipes& r, size_t i) : owner(r), index(i), lin(cpu_options(r.opt_), nullptr) {
      lin.set_recording(false);  // the device state records the amaxes
    }
    void forward(Backend&, float* y, ActIn x_in, const float* w, const float* b, int N, int in,
                 int out) override {
      owner.check_tokens(N, in, out);
      const float* x = owner.fp32(x_in, int64_t(N) * in);
      owner.record(index, Fp8Linear::X, x, int64_t(N) * in);
      owner.record(index, Fp8Linear::W, w, int64_t(in) * out);
      owner.current_scale(Fp8Linear::X, x, int64_t(N) * in);
      owner.current_scale(Fp8Linear::W, w, int64_t(in) * out);
      load_scales();
      owner.g_.host_op("fp8 linear (stand-in)", {y, x, w, b}, [&] {
        lin.new_weights();  // as the GPU layer: the weights quantised on every call
        lin.forward(cpu_backend(), y, x, w, b, N, in, out);
      });
      ++owner.counts_->gemms;
    }
    void backward(Backend&, float* dx, float* dw, float* db, const float* dy, ActIn x_in,
                  const float* w, int N, int in, int out) override {
      owner.check_tokens(N, in, out);
      const float* x = owner.fp32(x_in, int64_t(N) * in);
      owner.record(index, Fp8Linear::DY, dy, int64_t(N) * out);
      owner.record(index, Fp8Linear::W, w, int64_t(in) * out);
      owner.current_scale(Fp8Linear::DY, dy, int64_t(N) * out);
      owner.current_scale(Fp8Linear::W, w, int64_t(in) * out);
      owner.current_scale(Fp8Linear::X, x, int64_t(N) * in);
      load_scales();
      owner.g_.host_op("fp8 linear backward (stand-in)", {dx, dw, db, dy, x, w}, [&] {
        lin.new_weights();
        lin.backward(cpu_backend(), dx, dw, db, dy, x, w, N, in, out);
      });
      ++owner.counts_->gemms;
    }
    // The per-tensor recipes' scales as the device holds them (delayed: the step's, from the
    // state; current: just derived) into the CPU layer, which runs them as delayed scaling does.
    void load_scales() {
      const float* dev = owner.scaling_    ? owner.scaling_->scales(index)
                         : owner.current() ? owner.current_scales()
                                           : nullptr;
      if (dev == nullptr) return;  // MX: block scales, computed by the CPU layer itself
      float s[3];
      owner.g_.copy_d2h(s, dev, sizeof s);
      Json j = Json::array();
      for (float v : s) j.push_back(Fp8Linear::tensor_state(v, {}, nullptr));
      lin.restore(j, "guarded fp8 stand-in");
    }
    // Current scaling's layer takes its scales from the device (a delayed layer that records
    // nothing uses exactly the scales it is given).
    static Fp8Options cpu_options(Fp8Options o) {
      if (o.kind == Fp8RecipeKind::TensorwiseCurrent) {
        o.kind = Fp8RecipeKind::TensorwiseDelayed;
        o.amax_history = 1;
      }
      return o;
    }
    GuardedFp8Recipes& owner;
    size_t index;
    Fp8Linear lin;
  };

  bool current() const { return opt_.kind == Fp8RecipeKind::TensorwiseCurrent; }
  // Current scaling's working floats on the device: per tensor (x, W, dy) a history of one, its
  // pending amax, the tensor's amax and its scale; the three scales then consecutively.
  enum { kHist = 0, kPending = 1, kAmax = 2, kScale = 3, kPerTensor = 4 };
  float* current_floats() { return current_.ensure_n<float>(g_, 3 * kPerTensor + 3, "scratch"); }
  const float* current_scales() { return current_floats() + 3 * kPerTensor; }
  // Tensor t's current scale from values v (device memory), as the CUDA layer derives it: amax,
  // the TP all-reduce, then fmt_max / amax / 2^margin (1 when amax is 0 or not finite).
  void current_scale(int t, const float* v, int64_t n) {
    if (!current()) return;
    float* f = current_floats() + t * kPerTensor;
    int32_t* pos = pos_.ensure_n<int32_t>(g_, 2, "scratch");
    const float fresh[kPerTensor] = {0.f, -1.f, 0.f, 1.f};  // nothing pending, scale 1
    const int32_t start[2] = {0, 0};
    g_.copy_h2d(f, fresh, sizeof fresh);
    g_.copy_h2d(pos, start, sizeof start);
    g_.fp8_amax(v, n, f + kAmax);
    if (tp_group_) tp_group_->all_reduce(f + kAmax, 1, DType::F32, comm::ReduceOp::Max);
    g_.fp8_record_amax(f + kPending, f + kAmax);  // a non-finite amax keeps scale 1
    g_.fp8_roll_history(f + kHist, 1, pos, f + kPending, f + kAmax, f + kScale,
                        t == Fp8Linear::DY && opt_.hybrid, opt_.margin, /*most_recent=*/true);
    g_.copy_d2d(current_floats() + 3 * kPerTensor + t, f + kScale, sizeof(float));
  }
  // The GPU recipe's scratch holds max_tokens_ tokens (CudaFp8Scratch::check's message).
  void check_tokens(int N, int in, int out) const {
    LOOM_CHECK(N <= max_tokens_, "fp8 linear (guarded stand-in): layer ", N, "x", in, "->", out,
               " exceeds the scratch sized for ", max_tokens_, " tokens");
  }

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
  comm::Communicator* tp_group_ = nullptr;  // current scaling under TP
  int max_tokens_;
  std::vector<std::unique_ptr<Layer>> layers_;
  BackendBuffer widen_, current_, pos_;
  Counts* counts_;
};

}  // namespace loom::test
