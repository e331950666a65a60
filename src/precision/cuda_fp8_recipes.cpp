#include "precision/cuda_fp8_recipes.h"

#include <algorithm>

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
  LOOM_CHECK(!names_.empty(), "fp8 recipes (cuda): the model has no block linear to attach to");
  // One scratch for the widest selected layer: the layers run one after another on one stream.
  int widest = 0;
  size_t weight = 0;
  for (const Decoder::LinearInfo& l : model.linears())
    if (std::find(names_.begin(), names_.end(), l.name) != names_.end()) {
      widest = std::max({widest, l.in, l.out});
      weight = std::max(weight, size_t(l.in) * size_t(l.out));
    }
  scratch_ = std::make_unique<CudaFp8Scratch>(max_tokens, widest, weight, o.mx ? 2 : 1);
  for (const std::string& n : names_) {
    layers_.push_back(std::make_unique<Layer>(*this, o));
    model.attach_recipe(n, layers_.back().get());
  }
}

CudaFp8Recipes::~CudaFp8Recipes() = default;

void CudaFp8Recipes::begin_step() {
  for (auto& l : layers_) l->lin.begin_step();
}

void CudaFp8Recipes::set_recording(bool on) {
  for (auto& l : layers_) l->lin.set_recording(on);
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
