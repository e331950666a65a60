#include "precision/fp8_recipes.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/config_int32.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_bf16.h"

namespace loom {

using cpu::Fp8Format;

const char* fp8_recipe_name(Fp8RecipeKind k) {
  switch (k) {
    case Fp8RecipeKind::TensorwiseCurrent:
      return "fp8_tensorwise_current";
    case Fp8RecipeKind::TensorwiseDelayed:
      return "fp8_tensorwise_delayed";
    case Fp8RecipeKind::Mxfp8:
      return "mxfp8";
  }
  return "?";
}

bool Fp8Options::from(const Config& cfg, int n_layer, Fp8Options* out) {
  const std::string name = cfg.get_string("precision.fp8_recipe", "none");
  Fp8Options o;
  if (name == "none") {
    for (const char* k :
         {"precision.fp8_format", "precision.fp8_margin", "precision.fp8_amax_history",
          "precision.fp8_amax_compute", "precision.fp8_keep_first", "precision.fp8_keep_last"})
      LOOM_CHECK(!cfg.has(k), k, " (", cfg.where(k), ") is set but precision.fp8_recipe is not");
    return false;
  }
  bool known = false;
  for (Fp8RecipeKind k :
       {Fp8RecipeKind::TensorwiseCurrent, Fp8RecipeKind::TensorwiseDelayed, Fp8RecipeKind::Mxfp8})
    if (name == fp8_recipe_name(k)) {
      o.kind = k;
      known = true;
    }
  LOOM_CHECK(known, "precision.fp8_recipe (", cfg.where("precision.fp8_recipe"),
             "): unknown recipe '", name,
             "' (expected none, fp8_tensorwise_current, fp8_tensorwise_delayed or mxfp8)");
  const std::string fmt = cfg.get_string("precision.fp8_format", "e4m3");
  LOOM_CHECK(fmt == "e4m3" || fmt == "hybrid", "precision.fp8_format (",
             cfg.where("precision.fp8_format"), ") must be e4m3 or hybrid, got '", fmt, "'");
  o.hybrid = fmt == "hybrid";
  const bool per_tensor = o.kind != Fp8RecipeKind::Mxfp8;
  const bool delayed = o.kind == Fp8RecipeKind::TensorwiseDelayed;
  LOOM_CHECK(per_tensor || !cfg.has("precision.fp8_margin"),
             "precision.fp8_margin: mxfp8's block scales have no margin (OCP MX computes them)");
  for (const char* k : {"precision.fp8_amax_history", "precision.fp8_amax_compute"})
    LOOM_CHECK(delayed || !cfg.has(k), k, " applies to fp8_tensorwise_delayed only (recipe is ",
               name, ")");
  // A margin past 30 would scale every tensor below fp8's smallest subnormal.
  o.margin = get_int32(cfg, "precision.fp8_margin", 0, 0, 30);
  o.amax_history = get_int32(cfg, "precision.fp8_amax_history", 1024, 1, 1 << 20);
  const std::string comp = cfg.get_string("precision.fp8_amax_compute", "max");
  LOOM_CHECK(comp == "max" || comp == "most_recent", "precision.fp8_amax_compute (",
             cfg.where("precision.fp8_amax_compute"), ") must be max or most_recent, got '", comp,
             "'");
  o.most_recent = comp == "most_recent";
  o.keep_first = get_int32(cfg, "precision.fp8_keep_first", 0, 0, n_layer);
  o.keep_last = get_int32(cfg, "precision.fp8_keep_last", 0, 0, n_layer);
  LOOM_CHECK(o.keep_first + o.keep_last < n_layer, "precision.fp8_keep_first + fp8_keep_last (",
             o.keep_first + o.keep_last, ") keep all ", n_layer,
             " blocks in bf16: no layer would use ", name);
  *out = o;
  return true;
}

std::string Fp8Options::describe() const {
  std::string s = cat(fp8_recipe_name(kind), ", ", hybrid ? "hybrid (E4M3 x, W; E5M2 dy)" : "E4M3");
  if (kind != Fp8RecipeKind::Mxfp8) s += cat(", margin ", margin);
  if (kind == Fp8RecipeKind::TensorwiseDelayed)
    s += cat(", amax history ", amax_history, " (", most_recent ? "most_recent" : "max", ")");
  return s;
}

Fp8Linear::Fp8Linear(const Fp8Options& o, comm::Communicator* tp, ParamSet* params)
    : opt_(o),
      fwd_(Fp8Format::E4M3),
      bwd_(o.hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3),
      tp_(tp),
      params_(params) {
  if (o.kind == Fp8RecipeKind::TensorwiseDelayed)
    for (State& s : state_) s.hist.assign(size_t(o.amax_history), 0.f);
}

float Fp8Linear::tp_max(float amax) const {
  if (tp_ != nullptr && tp_->size() > 1) tp_->all_reduce(&amax, 1, DType::F32, comm::ReduceOp::Max);
  return amax;
}

// fmt_max / amax / 2^margin; amax 0 or non-finite keeps `prev` (TE: the scale is only updated
// from a positive finite amax); a quotient past fp32's range is clamped to its max.
static float scale_from(float fmt_max, float amax, int margin, float prev) {
  if (!(amax > 0.f) || !std::isfinite(amax)) return prev;
  const float s = std::ldexp(fmt_max / amax, -margin);
  return std::isfinite(s) ? s : FLT_MAX;
}

template <typename In>
float Fp8Linear::quantise_tensor(Tensor t, const In* v, int64_t n, uint16_t* out, bool again) {
  State& s = state_[t];
  const Fp8Format f = format(t);
  if (opt_.kind == Fp8RecipeKind::TensorwiseCurrent) {
    // The scale needs the amax of every element first: two passes (the second mostly from
    // cache for tensors of a few MB).
    const float amax = tp_max(cpu::fp8_amax(v, n));
    const float scale = scale_from(cpu::fp8_max(f), amax, opt_.margin, 1.f);
    if (!again) s.scale = scale;
    cpu::fp8_scaled_to_bf16(f, v, scale, out, n);
    return scale;
  }
  // Delayed: the scale is the step's, known before the pass, so the cast and this step's amax
  // (recorded for the next steps, reduced over TP x DP once in begin_step) share one pass. A
  // non-finite amax is not recorded (that step's gradients are not finite either, and the
  // trainer skips it); an evaluation pass records nothing.
  if (again || !record_) {
    cpu::fp8_scaled_to_bf16(f, v, s.scale, out, n);
    return s.scale;
  }
  const float amax = cpu::fp8_scaled_to_bf16_amax(f, v, s.scale, out, n);
  if (std::isfinite(amax)) {
    s.pending = s.seen ? std::max(s.pending, amax) : amax;
    s.seen = true;
  }
  return s.scale;
}

template <typename Fn>
void Fp8Linear::with_input(ActIn x, Fn&& fn) const {
  // Stored bf16 is quantised from its bits directly (the same values as widened, half the
  // bytes, no widening pass).
  if (x.bf16 != nullptr)
    fn(x.bf16);
  else
    fn(x.f32);
}

const uint16_t* Fp8Linear::weight_bf16(const float* w, int64_t n) const {
  if (params_ == nullptr || params_->bf16_data() == nullptr) return nullptr;
  const float* base = params_->fp32_storage();
  if (w < base || w + n > base + params_->total() || !params_->fp32_dropped_at(w - base))
    return nullptr;
  return params_->bf16_data() + (w - base);
}

float Fp8Linear::dw_beta(const float* dw, int64_t n) {
  if (params_ == nullptr) return 1.f;
  const float* g = params_->grad();
  if (g == nullptr || dw < g || dw + n > g + params_->total()) return 1.f;
  const uint64_t zeroed = params_->grad_zero_count();
  const bool zero = zeroed > 0 && dw_written_ != zeroed;  // 0 never written: counts from 1
  dw_written_ = zeroed;
  // This GEMM writes dW whole as its first writer after every zero_grad(), so zero_grad() may
  // leave it to this write (lazy zeroing, as Bf16Gemms::dw_beta does): no fill of the fp8
  // linears' weight gradients that is overwritten before anyone reads it.
  const int64_t at = dw - g;
  if (!lazy_zero_allowed_) params_->allow_lazy_zero(at, at + n);
  lazy_zero_allowed_ = true;
  if (zero) params_->grad_overwritten(at, at + n);
  return zero ? 0.f : 1.f;
}

void Fp8Linear::roll_history(const float* amax) {
  for (int t = 0; t < 3; ++t) {
    State& s = state_[t];
    if (!s.seen) continue;
    const float a = amax ? amax[t] : s.pending;
    s.hist[s.pos] = a;
    s.pos = (s.pos + 1) % s.hist.size();
    s.count = std::min(s.count + 1, s.hist.size());
    const float use = opt_.most_recent ? a : *std::max_element(s.hist.begin(), s.hist.end());
    s.scale = scale_from(cpu::fp8_max(format(Tensor(t))), use, opt_.margin, s.scale);
    s.seen = false;
    s.pending = 0.f;
  }
}

std::vector<float> Fp8Linear::history(Tensor t) const {
  const State& s = state_[t];
  std::vector<float> h;
  for (size_t i = 0; i < s.count; ++i)
    h.push_back(s.hist[(s.pos + s.hist.size() - s.count + i) % s.hist.size()]);
  return h;
}

// fp32 values as their bit patterns: JSON numbers would round-trip too, but bits say "exact".
static Json bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return Json(int64_t(u));
}

static float float_of(const Json& j) {
  const uint32_t u = static_cast<uint32_t>(j.as_int(0, UINT32_MAX));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Json Fp8Linear::tensor_state(float scale, const std::vector<float>& history, const float* pending) {
  Json h = Json::array();
  for (float a : history) h.push_back(bits_of(a));
  Json o = Json::object();
  o["scale"] = bits_of(scale);
  o["history"] = h;
  if (pending != nullptr) o["pending"] = bits_of(*pending);
  return o;
}

Json Fp8Linear::state() const {
  Json out = Json::array();
  for (int t = 0; t < 3; ++t) {
    const State& s = state_[t];
    out.push_back(tensor_state(s.scale, history(Tensor(t)), s.seen ? &s.pending : nullptr));
  }
  return out;
}

void Fp8Linear::restore(const Json& j, const std::string& where) {
  LOOM_CHECK(j.is_array() && j.as_array().size() == 3, where,
             ": expected the states of x, W and dy (3 entries)");
  for (int t = 0; t < 3; ++t) {
    const Json& o = j.as_array()[size_t(t)];
    LOOM_CHECK(o.is_object() && o.contains("scale") && o.contains("history"), where, "[", t,
               "]: expected an object with scale and history");
    const Json::Array& h = o.at("history").as_array();
    LOOM_CHECK(h.size() <= size_t(opt_.amax_history), where, "[", t, "]: ", h.size(),
               " history entries, but precision.fp8_amax_history is ", opt_.amax_history);
    State s;
    s.hist.assign(size_t(opt_.amax_history), 0.f);
    for (size_t i = 0; i < h.size(); ++i) {
      s.hist[i] = float_of(h[i]);
      LOOM_CHECK(std::isfinite(s.hist[i]) && s.hist[i] >= 0.f, where, "[", t, "]: history entry ",
                 i, " is not a finite amax");
    }
    s.count = h.size();
    s.pos = s.count % s.hist.size();
    s.scale = float_of(o.at("scale"));
    LOOM_CHECK(std::isfinite(s.scale) && s.scale > 0.f, where, "[", t, "]: scale ", s.scale,
               " is not positive and finite");
    s.seen = o.contains("pending");
    if (s.seen) s.pending = float_of(o.at("pending"));
    state_[t] = std::move(s);
  }
}

void Fp8Linear::quantise_weight(const float* w, int in, int out) {
  if (fresh_ && wptr_ == w && wq_.size() == size_t(in) * size_t(out)) return;
  const int64_t n = int64_t(in) * out;
  wq_.resize(size_t(n));
  const uint16_t* wb = weight_bf16(w, n);
  if (opt_.kind == Fp8RecipeKind::Mxfp8) {
    // Both blockings (along in for forward, along out for dgrad) in one read of W.
    wq_t_.resize(size_t(n));
    if (wb)
      cpu::mx_quantize_both(fwd_, wb, out, in, wq_.data(), wq_t_.data());
    else
      cpu::mx_quantize_both(fwd_, w, out, in, wq_.data(), wq_t_.data());
  } else if (wb) {
    quantise_tensor(W, wb, n, wq_.data());
  } else {
    quantise_tensor(W, w, n, wq_.data());
  }
  wptr_ = w;
  fresh_ = true;
}

uint16_t* Fp8Linear::dy_bits(const float* dy, int64_t n) {
  s_->dy.resize(size_t(n));
  dy_noted_ = dy;
  dy_noted_n_ = n;
  return s_->dy.data();
}

void Fp8Linear::forward(Backend&, float* y, ActIn x_in, const float* w, const float* b, int N,
                        int in, int out) {
  dy_noted_ = nullptr;
  if (N == 0 || out == 0) return;
  quantise_weight(w, in, out);
  const int64_t nx = int64_t(N) * in;
  const bool mx = opt_.kind == Fp8RecipeKind::Mxfp8;
  // (an evaluation forward keeps nothing: no backward follows it)
  const bool keep = !mx && record_;
  std::vector<uint16_t>& a_ = keep ? xq_ : s_->a;
  a_.resize(size_t(nx));
  kept_x_ = nullptr;
  float alpha = 1.f;
  with_input(x_in, [&](const auto* x) {
    if (mx) {
      cpu::mx_quantize(fwd_, x, N, in, in, false, nullptr, nullptr, a_.data());
      return;
    }
    const float s_x = quantise_tensor(X, x, nx, a_.data());
    alpha = (1.f / s_x) * (1.f / state_[W].scale);  // scale_inv_x * scale_inv_w
    if (keep) kept_x_ = x, kept_n_ = nx, kept_scale_ = s_x;
  });
  // (alpha varies per call or step: applied after the GEMM, no oneDNN primitive per value)
  cpu::gemm_bf16_varying_alpha(false, true, N, out, in, alpha, a_.data(), in, wq_.data(), in, 0.f,
                               y, out, b);
}

void Fp8Linear::backward(Backend&, float* dx, float* dw, float* db, const float* dy, ActIn x_in,
                         const float* w, int N, int in, int out) {
  const int64_t ny = int64_t(N) * out, nx = int64_t(N) * in;
  // dy's bf16 bits where the caller left them (dy_bits): the same values as dy, half the bytes.
  const uint16_t* dyb = dy == dy_noted_ && ny == dy_noted_n_ ? s_->dy.data() : nullptr;
  dy_noted_ = nullptr;
  if (N == 0) return;
  quantise_weight(w, in, out);
  const bool mx = opt_.kind == Fp8RecipeKind::Mxfp8;
  std::vector<uint16_t>&a_ = s_->a, &b_ = s_->b;
  b_.resize(size_t(ny));
  float s_dy = 1.f, s_x = 1.f;
  auto with_dy = [&](auto&& fn) {
    if (dyb)
      fn(dyb);
    else
      fn(dy);
  };
  with_dy([&](const auto* d) {
    if (!mx)
      s_dy = quantise_tensor(DY, d, ny, b_.data());
    else if (dx != nullptr)
      cpu::mx_quantize(bwd_, d, N, out, out, false, nullptr, nullptr, b_.data());
  });
  if (dx != nullptr) {  // dx[N, in] = dy W, reduced over out: MX blocks of W along out
    const float alpha = mx ? 1.f : (1.f / s_dy) * (1.f / state_[W].scale);
    cpu::gemm_bf16_varying_alpha(false, false, N, in, out, alpha, b_.data(), out,
                                 mx ? wq_t_.data() : wq_.data(), in, 0.f, dx, in);
  }
  if (dw != nullptr) {  // dW[out, in] += dy^T x, reduced over N: MX blocks along the tokens
    const uint16_t* xq = a_.data();
    if (mx)
      with_dy([&](const auto* d) {
        cpu::mx_quantize(bwd_, d, N, out, out, true, nullptr, nullptr, b_.data());
      });
    with_input(x_in, [&](const auto* x) {
      if (!mx && kept_x_ == x && kept_n_ == nx) {  // the forward's quantised x
        xq = xq_.data();
        s_x = kept_scale_;
        return;
      }
      a_.resize(size_t(nx));
      xq = a_.data();
      if (mx)
        cpu::mx_quantize(fwd_, x, N, in, in, true, nullptr, nullptr, a_.data());
      else  // x's scale as the forward computed it: current scaling sees the same values again
        // (and delayed scaling's scale is fixed within the step, its amax recorded once)
        s_x = quantise_tensor(X, x, nx, a_.data(), /*again=*/true);
    });
    const float alpha = mx ? 1.f : (1.f / s_dy) * (1.f / s_x);
    cpu::gemm_bf16_varying_alpha(true, false, out, in, N, alpha, b_.data(), out, xq, in,
                                 dw_beta(dw, int64_t(out) * in), dw, in);
  }
  kept_x_ = nullptr;
  if (db != nullptr)  // column sums of the fp32 dy, as the fp32 path computes them (x unused)
    cpu::matmul_backward(nullptr, nullptr, db, dy, nullptr, w, N, in, out);
}

Fp8Recipes::Fp8Recipes(Decoder& model, const Fp8Options& o) : opt_(o) {
  const TensorParallel& tp = model.tensor_parallel();
  tp_ = tp.size > 1 ? tp.comm : nullptr;
  for (const std::string& name : fp8_layer_names(model, o)) {
    linears_.push_back(std::make_unique<Fp8Linear>(o, tp_, &model.params()));
    linears_.back()->share_scratch(&scratch_);
    names_.push_back(name);
    model.attach_recipe(name, linears_.back().get());
  }
}

std::vector<std::string> fp8_layer_names(const Decoder& model, const Fp8Options& o) {
  const int L = model.config().n_layer;
  std::vector<std::string> names;
  for (const auto& l : model.linears()) {
    if (l.name.rfind("blocks.", 0) != 0) continue;  // the head stays bf16
    const int layer = std::stoi(l.name.substr(7));
    if (layer < o.keep_first || layer >= L - o.keep_last) continue;
    names.push_back(l.name);
  }
  return names;
}

Fp8Linear* Fp8Recipes::get(const std::string& name) {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return linears_[i].get();
  return nullptr;
}

void Fp8Recipes::new_weights() {
  for (auto& l : linears_) l->new_weights();
}

void Fp8Recipes::begin_step() {
  new_weights();
  if (opt_.kind != Fp8RecipeKind::TensorwiseDelayed) return;
  // Every linear's three amaxes in one buffer and one all-reduce (TE reduces them together).
  std::vector<float> amax;
  amax.reserve(linears_.size() * 3);
  for (auto& l : linears_)
    for (int t = 0; t < 3; ++t) amax.push_back(l->pending_amax(Fp8Linear::Tensor(t)));
  comm::Communicator* g = amax_group_ != nullptr ? amax_group_ : tp_;
  if (g != nullptr && g->size() > 1)
    g->all_reduce(amax.data(), int64_t(amax.size()), DType::F32, comm::ReduceOp::Max);
  for (size_t i = 0; i < linears_.size(); ++i) linears_[i]->roll_history(&amax[i * 3]);
}

void Fp8Recipes::set_evaluating(bool on) {
  for (auto& l : linears_) l->set_recording(!on);
}

Json fp8_recipes_state(int amax_history, const std::vector<std::string>& names,
                       const std::vector<Json>& layers) {
  LOOM_CHECK(names.size() == layers.size(), "fp8 state: ", names.size(), " names for ",
             layers.size(), " layers");
  Json by_name = Json::object();
  for (size_t i = 0; i < names.size(); ++i) by_name[names[i]] = layers[i];
  Json out = Json::object();
  out["recipe"] = fp8_recipe_name(Fp8RecipeKind::TensorwiseDelayed);
  out["amax_history"] = amax_history;
  out["layers"] = by_name;
  return out;
}

const Json::Object* fp8_state_layers(const Json* j, const std::vector<std::string>& names,
                                     int amax_history, const std::string& where) {
  if (j == nullptr || j->is_null()) {
    log_warn(where, ": no fp8 delayed-scaling state (another recipe, or none): the amax ",
             "histories start empty, so this run is not bit-identical to an uninterrupted one");
    return nullptr;
  }
  LOOM_CHECK(j->is_object() && j->contains("layers") && j->contains("amax_history"), where,
             ": fp8 state without layers or amax_history");
  const int64_t len = j->at("amax_history").as_int();
  LOOM_CHECK(len == amax_history, where, ": fp8 amax histories of length ", len,
             ", but this run's precision.fp8_amax_history is ", amax_history);
  const Json::Object& layers = j->at("layers").as_object();
  for (const std::string& n : names)
    LOOM_CHECK(layers.count(n) == 1, where, ": no fp8 state for ", n,
               " (the checkpoint's fp8 layers differ: fp8_keep_first / fp8_keep_last)");
  LOOM_CHECK(layers.size() == names.size(), where, ": fp8 state for ", layers.size(),
             " layers, but this run has ", names.size(), " fp8 layers");
  return &layers;
}

Json Fp8Recipes::state() const {
  if (opt_.kind != Fp8RecipeKind::TensorwiseDelayed) return Json();
  std::vector<Json> layers;
  for (const auto& l : linears_) layers.push_back(l->state());
  return fp8_recipes_state(opt_.amax_history, names_, layers);
}

void Fp8Recipes::restore(const Json* j, const std::string& where) {
  if (opt_.kind != Fp8RecipeKind::TensorwiseDelayed) return;  // nothing kept between steps
  const Json::Object* layers = fp8_state_layers(j, names_, opt_.amax_history, where);
  if (layers == nullptr) return;
  for (size_t i = 0; i < linears_.size(); ++i)
    linears_[i]->restore(layers->at(names_[i]), cat(where, ": fp8 state of ", names_[i]));
}

std::unique_ptr<Fp8Recipes> attach_fp8_recipes(const Config& cfg, Decoder& model, bool quiet) {
  Fp8Options o;
  if (!Fp8Options::from(cfg, model.config().n_layer, &o)) return nullptr;
  return attach_fp8_recipes(o, model, quiet);
}

std::unique_ptr<Fp8Recipes> attach_fp8_recipes(const Fp8Options& o, Decoder& model, bool quiet) {
  auto r = std::make_unique<Fp8Recipes>(model, o);
  if (!quiet)
    log_info("fp8: ", o.describe(), " on ", r->names().size(), " linear layers (bf16: the head",
             o.keep_first + o.keep_last > 0
                 ? cat(", the first ", o.keep_first, " and last ", o.keep_last, " blocks")
                 : std::string(),
             "); GEMMs: ", cpu::bf16_gemm_path_name(), " on fp8 values");
  return r;
}

}  // namespace loom
