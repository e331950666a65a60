// Autoregressive generation from a trained decoder (no KV cache yet: each new token re-runs
// the forward pass over the last max_seq tokens; the serving issue adds the cache).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/model_loader.h"  // load_model_from_checkpoint
#include "infer/sampler.h"
#include "model/decoder.h"

namespace loom {

// Appends `n` sampled tokens to `tokens`; on_token sees each new one as it is produced.
void generate(Decoder& model, std::vector<int32_t>& tokens, int n, const SamplingOptions& o,
              const std::function<void(int32_t)>& on_token = {});

}  // namespace loom
