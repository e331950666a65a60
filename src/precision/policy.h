// Precision policies. fp32: everything fp32. bf16: model weights and activations rounded to
// bf16, fp32 master weights and fp32 gradient accumulation. fp16: the same with fp16 and
// dynamic loss scaling. On the CPU the arithmetic is fp32 over values rounded (to nearest
// even) exactly where a GPU stores the narrow type, so both paths see the same numbers.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/json.h"

namespace loom {

class Config;

struct PrecisionPolicy {
  std::string name = "fp32";
  DType compute = DType::F32;  // model weights and activations
  bool loss_scaling = false;
};
PrecisionPolicy precision_from_name(const std::string& name);

// Dynamic loss scaling (fp16): multiply the loss gradient by `scale`; a step whose gradients
// hold inf/NaN is skipped and the scale backs off; after `growth_interval` clean steps it grows.
class LossScaler {
 public:
  struct Options {
    double initial = 65536.0, growth_factor = 2.0, backoff_factor = 0.5, min_scale = 1.0;
    int64_t growth_interval = 1000;
  };
  LossScaler() = default;
  explicit LossScaler(const Options& o) : opt_(o), scale_(o.initial) {}
  static Options options_from(const Config& cfg);

  double scale() const { return scale_; }
  // Records whether this step's gradients were finite; returns true if the step may proceed.
  bool update(bool grads_finite);
  int64_t skipped_steps() const { return skipped_; }

  Json state() const;
  void restore(const Json& j);

 private:
  Options opt_;
  double scale_ = 1.0;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace loom
