#include "optim/adamw.h"

#include <algorithm>

#include "core/config.h"
#include "core/error.h"

namespace loom {

AdamWConfig adamw_config_from(const Config& cfg) {
  AdamWConfig c;
  c.beta1 = cfg.get_double("optim.beta1", c.beta1);
  c.beta2 = cfg.get_double("optim.beta2", c.beta2);
  c.eps = cfg.get_double("optim.eps", c.eps);
  c.weight_decay = cfg.get_double("optim.weight_decay", c.weight_decay);
  LOOM_CHECK(c.beta1 >= 0 && c.beta1 < 1, "optim.beta1 must lie in [0, 1)");
  LOOM_CHECK(c.beta2 >= 0 && c.beta2 < 1, "optim.beta2 must lie in [0, 1)");
  LOOM_CHECK(c.eps > 0, "optim.eps must be positive");
  LOOM_CHECK(c.weight_decay >= 0, "optim.weight_decay must be >= 0");
  return c;
}

AdamW::AdamW(ParamSet& params, const AdamWConfig& cfg, DType param_dtype, Backend& backend)
    : AdamW(params, cfg, param_dtype, backend, 0, params.total(), false) {
  sync_master_from_model();
}

AdamW::AdamW(ParamSet& params, const AdamWConfig& cfg, DType param_dtype, Backend& backend,
             int64_t lo, int64_t hi, bool keep_master)
    : params_(params),
      cfg_(cfg),
      param_dtype_(param_dtype),
      be_(backend),
      lo_(lo),
      hi_(hi),
      keep_master_(keep_master) {
  LOOM_CHECK(0 <= lo && lo <= hi && hi <= params.total(), "AdamW: range [", lo, ", ", hi,
             ") outside the parameter set's ", params.total(), " elements");
  const size_t bytes = sizeof(float) * size_t(hi - lo);
  for (BackendBuffer* b : {&m_, &v_}) {
    *b = BackendBuffer(be_, bytes, "optimizer");
    be_.fill_bytes(b->data(), 0, bytes);
  }
  if (param_dtype_ != DType::F32 || keep_master) {
    master_ = BackendBuffer(be_, bytes, "optimizer");
    be_.fill_bytes(master_.data(), 0, bytes);
  }
}

float* AdamW::weights() {
  model_written_ = false;  // the caller may change the master
  return master_.empty() ? params_.data() + lo_ : master_.as<float>();
}

float* AdamW::master() {
  model_written_ = false;
  return master_.empty() ? nullptr : master_.as<float>();
}

void AdamW::set_steps_taken(int64_t t) {
  t_ = t;
  model_written_ = false;
}

void AdamW::sync_master_from_model() {
  model_written_ = false;
  if (master_.empty() || hi_ == lo_) return;
  // (Widened from the bf16 copy where the model keeps no fp32 values.)
  params_.copy_values_to(master_.as<float>(), lo_, hi_);
}

void AdamW::write_model(int64_t a, int64_t b) {
  a = std::max(a, lo_);
  b = std::min(b, hi_);
  if (master_.empty() || a >= b) return;
  if (model_written_) return;  // update() wrote [lo_, hi_) in its own pass
  write_model_range(a, b);
}

void AdamW::write_model_range(int64_t a, int64_t b) {
  if (a >= b) return;
  params_.for_runs(a, b, [&](int64_t lo, int64_t hi, bool dropped) {
    const float* src = master_.as<float>() + (lo - lo_);
    if (dropped) {  // 2-byte weights: the bf16 copy is the model's only copy
      be_.convert(params_.bf16_data() + lo, DType::BF16, src, DType::F32, hi - lo);
      params_.note_bf16_written(lo, hi);
      return;
    }
    float* model = params_.fp32_storage() + lo;  // (a kept run)
    be_.copy_d2d(model, src, sizeof(float) * (hi - lo));
    if (param_dtype_ == DType::F32) return;
    // On the backend: the model's buffer is device memory there (core's round_to is the
    // CPU's). bf16: rounded and, where the set keeps one, stored in its bf16 copy in the same
    // pass.
    uint16_t* copy = param_dtype_ == DType::BF16 ? params_.bf16_data() : nullptr;
    be_.round_to(param_dtype_, model, hi - lo, copy ? copy + lo : nullptr);
    if (param_dtype_ == DType::BF16) params_.note_bf16_written(lo, hi);
  });
}

void AdamW::sync_model_from_master() {
  write_model(lo_, hi_);
}

void AdamW::update(double lr, float grad_scale, const float* grad) {
  ++t_;
  model_written_ = false;
  float* w = master_.empty() ? params_.data() + lo_ : master_.as<float>();
  // The bf16 policy with its own master (not ZeRO-3's, whose model buffer holds a range only
  // while it is gathered): the model's weights are derived in the update's pass, so the
  // write_model that follows (step, the data-parallel engine) finds nothing left to do.
  const bool fused = param_dtype_ == DType::BF16 && !master_.empty() && !keep_master_;
  uint16_t* copy = fused ? params_.bf16_data() : nullptr;
  int64_t written = lo_;  // fused: the model is written on [lo_, written)
  for (const ParamInfo& p : params_.infos()) {
    if (!p.trainable) continue;  // frozen: as a learning rate of 0 (no decay either)
    const int64_t a = std::max(p.offset, lo_), b = std::min(p.offset + p.numel, hi_);
    if (a >= b) continue;
    const int64_t k = a - lo_;
    const float wd = p.decay ? static_cast<float>(cfg_.weight_decay) : 0.f;
    if (!fused) {
      be_.adamw(w + k, grad + k, m() + k, v() + k, b - a, static_cast<float>(lr),
                static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                static_cast<float>(cfg_.eps), wd, grad_scale, t_);
      continue;
    }
    // What lies between (frozen parameters, padding) as write_model derives it.
    if (a > written) write_model_range(written, a);
    be_.adamw_to_bf16(w + k, grad + k, m() + k, v() + k, b - a, static_cast<float>(lr),
                      static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                      static_cast<float>(cfg_.eps), wd, grad_scale, t_,
                      p.fp32_dropped ? nullptr : params_.fp32_storage() + a,
                      copy ? copy + a : nullptr);
    params_.note_bf16_written(a, b);
    written = std::max(written, b);
  }
  if (!fused) return;
  write_model_range(written, hi_);
  model_written_ = true;
}

void AdamW::step(double lr, float grad_scale) {
  update(lr, grad_scale, params_.grad() + lo_);
  sync_model_from_master();
}

std::vector<StateSlice> AdamW::state_slices() {
  model_written_ = false;  // the views may be written (a checkpoint's restore)
  std::vector<StateSlice> out;
  for (const ParamInfo& p : params_.infos()) {
    const int64_t a = std::max(p.offset, lo_), b = std::min(p.offset + p.numel, hi_);
    if (a >= b) continue;
    auto add = [&](const char* prefix, float* buf) {
      out.push_back({std::string(prefix) + p.name,
                     Tensor::view_of(buf + (a - lo_), {b - a}, DType::F32), p.numel, a - p.offset});
    };
    add("exp_avg.", m());
    add("exp_avg_sq.", v());
    if (!master_.empty()) add("master.", master_.as<float>());
  }
  return out;
}

std::map<std::string, Tensor> AdamW::state_tensors() {
  model_written_ = false;  // the views may be written (a checkpoint's restore)
  LOOM_CHECK(lo_ == 0 && hi_ == params_.total(),
             "AdamW::state_tensors: a shard's state has no whole tensors (use state_slices)");
  std::map<std::string, Tensor> s;
  for (const ParamInfo& p : params_.infos()) {
    s["exp_avg." + p.name] = Tensor::view_of(m() + p.offset, p.shape, DType::F32);
    s["exp_avg_sq." + p.name] = Tensor::view_of(v() + p.offset, p.shape, DType::F32);
    if (!master_.empty())
      s["master." + p.name] = Tensor::view_of(master_.as<float>() + p.offset, p.shape, DType::F32);
  }
  return s;
}

std::vector<std::pair<const void*, int64_t>> AdamW::buffers() const {
  const int64_t bytes = int64_t(sizeof(float)) * (hi_ - lo_);
  std::vector<std::pair<const void*, int64_t>> b{{m_.data(), bytes}, {v_.data(), bytes}};
  if (!master_.empty()) b.push_back({master_.data(), bytes});
  return b;
}

}  // namespace loom
