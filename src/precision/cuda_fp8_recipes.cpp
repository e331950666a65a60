#include "precision/cuda_fp8_recipes.h"

#include <algorithm>

#include "comm/communicator.h"
#include "core/error.h"

namespace loom {

CudaFp8Options cuda_fp8_options(const Fp8Options& o) {
  CudaFp8Options c;
  c.mx = o.kind == Fp8RecipeKind::Mxfp8;
  c.hybrid = o.hybrid;
  c.margin = o.margin;
  c.amax_history = o.kind == Fp8RecipeKind::TensorwiseDelayed ? o.amax_history : 0;
  c.most_recent = o.most_recent;
  return c;
}

struct CudaFp8Recipes::Layer : GemmRecipe {
  Layer(CudaFp8Recipes& r, const CudaFp8Options& o) : owner(r), lin(r.be_, o, *r.scratch_) {}
  void forward(Backend&, float* y, ActIn x, const float* w, const float* b, int N, int in,
               int out) override {
    if (owner.mark) owner.mark("fp8 linear");
    lin.forward(y, owner.fp32(x, int64_t(N) * in), w, b, N, in, out);
  }
  void backward(Backend&, float* dx, float* dw, float* db, const float* dy, ActIn x, const float* w,
                int N, int in, int out) override {
    if (owner.mark) owner.mark("fp8 linear");
    lin.backward(dx, dw, db, dy, owner.fp32(x, int64_t(N) * in), w, N, in, out);
  }
  CudaFp8Recipes& owner;
  CudaFp8Linear lin;
};

CudaFp8Recipes::CudaFp8Recipes(Decoder& model, CudaBackend& be, const CudaFp8Options& o,
                               int max_tokens, const Fp8Options& keep)
    : be_(be), delayed_(o.amax_history > 0) {
  names_ = fp8_layer_names(model, keep);
  // A pipeline stage may hold no selected linear (its blocks kept in bf16, or only the head):
  // it attaches nothing, but delayed scaling still checkpoints its (empty) state, as the CPU
  // recipe's Fp8Recipes does on such a stage.
  // One scratch for the widest selected layer: the layers run one after another on one stream.
  int widest = 0;
  size_t weight = 0;
  for (const Decoder::LinearInfo& l : model.linears())
    if (std::find(names_.begin(), names_.end(), l.name) != names_.end()) {
      widest = std::max({widest, l.in, l.out});
      weight = std::max(weight, size_t(l.in) * size_t(l.out));
    }
  if (!names_.empty())
    scratch_ = std::make_unique<CudaFp8Scratch>(max_tokens, widest, weight, o.mx ? 2 : 1);
  if (delayed_) {
    Fp8Options d = keep;
    d.kind = Fp8RecipeKind::TensorwiseDelayed;
    d.hybrid = o.hybrid;
    d.margin = o.margin;
    d.amax_history = o.amax_history;
    d.most_recent = o.most_recent;
    scaling_ = std::make_unique<DeviceFp8Scaling>(be, d, names_);
  }
  for (size_t i = 0; i < names_.size(); ++i) {
    layers_.push_back(std::make_unique<Layer>(*this, o));
    if (scaling_) {
      DeviceFp8Scaling* s = scaling_.get();
      layers_.back()->lin.use_delayed_state(
          s->scales(i), [s, i](int t, const float* amax) { s->record_amax(i, t, amax); });
    }
    model.attach_recipe(names_[i], layers_.back().get());
  }
}

CudaFp8Recipes::~CudaFp8Recipes() = default;

void CudaFp8Recipes::begin_step() {
  if (scaling_) scaling_->begin_step(amax_group_);
}

void CudaFp8Recipes::set_recording(bool on) {
  if (scaling_) scaling_->set_recording(on);  // the only recipe that records anything
}

void CudaFp8Recipes::set_tp_group(comm::Communicator* g) {
  for (auto& l : layers_) {
    if (g == nullptr || g->size() == 1) {
      l->lin.reduce_amax = nullptr;
    } else {
      l->lin.reduce_amax = [g](float* amax) {
        g->all_reduce(amax, 1, DType::F32, comm::ReduceOp::Max);
      };
    }
  }
}

Json CudaFp8Recipes::state() const {
  return scaling_ ? scaling_->state() : Json();
}

void CudaFp8Recipes::restore(const Json* j, const std::string& where) {
  if (scaling_) scaling_->restore(j, where);  // the other recipes keep nothing between steps
}

const CudaFp8Linear& CudaFp8Recipes::linear(size_t i) const {
  return layers_.at(i)->lin;
}

const float* CudaFp8Recipes::fp32(ActIn x, int64_t n) {
  if (x.f32) return x.f32;
  float* s = widen_.ensure_n<float>(be_, size_t(n), "scratch");
  be_.convert(s, DType::F32, x.bf16, DType::BF16, n);
  return s;
}

}  // namespace loom
