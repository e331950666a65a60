#include "optim/adamw.h"

#include <cstring>

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
    : params_(params), cfg_(cfg), param_dtype_(param_dtype), be_(backend) {
  m_ = Tensor::zeros({params.total()});
  v_ = Tensor::zeros({params.total()});
  if (param_dtype_ != DType::F32) {
    master_ = Tensor::zeros({params.total()});
    sync_master_from_model();
  }
}

void AdamW::sync_master_from_model() {
  if (!master_.defined()) return;
  std::memcpy(master_.data<float>(), params_.data(), sizeof(float) * params_.total());
}

void AdamW::sync_model_from_master() {
  if (!master_.defined()) return;
  std::memcpy(params_.data(), master_.data<float>(), sizeof(float) * params_.total());
  round_to(param_dtype_, params_.data(), static_cast<size_t>(params_.total()));
}

void AdamW::step(double lr, float grad_scale) {
  ++t_;
  float* w = master_.defined() ? master_.data<float>() : params_.data();
  for (const ParamInfo& p : params_.infos()) {
    if (!p.trainable) continue;  // frozen: as a learning rate of 0 (no decay either)
    be_.adamw(w + p.offset, params_.grad() + p.offset, m_.data<float>() + p.offset,
              v_.data<float>() + p.offset, p.numel, static_cast<float>(lr),
              static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
              static_cast<float>(cfg_.eps), p.decay ? static_cast<float>(cfg_.weight_decay) : 0.f,
              grad_scale, t_);
  }
  sync_model_from_master();
}

std::map<std::string, Tensor> AdamW::state_tensors() {
  std::map<std::string, Tensor> s;
  for (const ParamInfo& p : params_.infos()) {
    s["exp_avg." + p.name] = Tensor::view_of(m_.data<float>() + p.offset, p.shape, DType::F32);
    s["exp_avg_sq." + p.name] = Tensor::view_of(v_.data<float>() + p.offset, p.shape, DType::F32);
    if (master_.defined())
      s["master." + p.name] =
          Tensor::view_of(master_.data<float>() + p.offset, p.shape, DType::F32);
  }
  return s;
}

}  // namespace loom
