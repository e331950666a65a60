// Conversions between the model's configuration and the Hugging Face shape description, so
// checkpoints, export and import agree on one model definition.
#pragma once

#include "ckpt/hf_export.h"
#include "model/model_config.h"

namespace loom::ckpt {

HfModelShape hf_shape_of(const ModelConfig& cfg);
ModelConfig model_config_of(const HfModelShape& shape);

}  // namespace loom::ckpt
