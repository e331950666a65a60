// Sampling for the serving engine, per completion (SamplingParams, engine_api.h): logit_bias,
// penalties (repetition over prompt and output as Hugging Face and vLLM apply it; presence and
// frequency over the output, OpenAI's definition), temperature, top-k, top-p, min-p, then a draw
// from the counter-based RNG keyed by (seed, completion index, output position), so a request with
// a seed gets the same tokens whatever else is in the batch. Log-probabilities are those of the raw
// logits (log-softmax before any penalty or temperature), as OpenAI and vLLM report them, or with
// SamplingParams::logprobs_at_temperature of the raw logits divided by the temperature.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "infer/engine_api.h"

namespace loom::infer {

// Throws loom::Error naming the field for a value out of range.
void validate(const SamplingParams& p, int vocab);

struct SampledToken {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // top-k alternatives (k = params.logprobs)
};

// logits [vocab] (scratch: modified); `seen` the completion's tokens so far (prompt first
// `prompt_len` of them); `seed` the stream, `draw` the output position. `allowed`, when given,
// holds a bit per token id (bit t of word t / 64): the others cannot be drawn (a structured
// output's mask); the reported log-probabilities stay those of the raw logits.
SampledToken sample(float* logits, int vocab, const SamplingParams& p,
                    const std::vector<int32_t>& seen, int prompt_len, uint64_t seed,
                    uint64_t stream, uint64_t draw, const uint64_t* allowed = nullptr);

}  // namespace loom::infer
