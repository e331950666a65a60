// Builds the trainer's batch source from the [data] section of a config:
//   source = "text"    byte-level fallback over plain-text files (data.paths)
//   source = "tokens"  Megatron .bin/.idx token files (data.prefixes, data.weights, data.split,
//                      data.packed, data.cache_dir, data.tokenizer)
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "model/model_config.h"
#include "train/batch.h"

namespace loom {

struct TrainOptions;

// `split` is "train" or "valid".
std::unique_ptr<BatchSource> make_batch_source(const Config& cfg, const TrainOptions& opt,
                                               const ModelConfig& model, const std::string& split);

}  // namespace loom
