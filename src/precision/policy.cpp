#include "precision/policy.h"

#include <algorithm>

#include "core/config.h"
#include "core/error.h"

namespace loom {

PrecisionPolicy precision_from_name(const std::string& name) {
  PrecisionPolicy p;
  p.name = name;
  if (name == "fp32") return p;
  if (name == "bf16") {
    p.compute = DType::BF16;
    return p;
  }
  if (name == "fp16") {
    p.compute = DType::F16;
    p.loss_scaling = true;
    return p;
  }
  fail("precision must be fp32, bf16 or fp16, got '", name, "'");
}

LossScaler::Options LossScaler::options_from(const Config& cfg) {
  Options o;
  o.initial = cfg.get_double("precision.initial_loss_scale", o.initial);
  o.growth_interval = cfg.get_int("precision.loss_scale_window", o.growth_interval);
  o.min_scale = cfg.get_double("precision.min_loss_scale", o.min_scale);
  LOOM_CHECK(o.initial > 0, "precision.initial_loss_scale must be positive");
  LOOM_CHECK(o.growth_interval > 0, "precision.loss_scale_window must be positive");
  LOOM_CHECK(o.min_scale > 0, "precision.min_loss_scale must be positive");
  return o;
}

bool LossScaler::update(bool grads_finite) {
  if (!grads_finite) {
    scale_ = std::max(opt_.min_scale, scale_ * opt_.backoff_factor);
    good_steps_ = 0;
    ++skipped_;
    return false;
  }
  if (++good_steps_ >= opt_.growth_interval) {
    scale_ *= opt_.growth_factor;
    good_steps_ = 0;
  }
  return true;
}

Json LossScaler::state() const {
  Json j = Json::object();
  j["scale"] = scale_;
  j["good_steps"] = good_steps_;
  j["skipped"] = skipped_;
  return j;
}

void LossScaler::restore(const Json& j) {
  scale_ = j.at("scale").as_double();
  good_steps_ = j.at("good_steps").as_int();
  skipped_ = j.at("skipped").as_int();
}

}  // namespace loom
