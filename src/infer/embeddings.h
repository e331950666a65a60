// Embeddings of token sequences by a loaded decoder: each sequence's final hidden states (the
// output of the final norm, what the head reads) pooled into one vector of d_model floats,
// by the last token's state or the mean over every token, then (unless kept raw) scaled to
// unit L2 norm so that a dot product is a cosine similarity. In-process users (semantic
// deduplication) call embed() on a model they loaded; `loom serve` answers POST
// /v1/embeddings with it through the engine (Engine::submit_embeddings).
//
// `last` is the default: in a causal decoder only the last token has attended to the whole
// sequence, and decoder embedding models (e5-mistral, Qwen3-Embedding) pool it; `mean` also
// averages the states of early tokens, which saw only a prefix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "infer/engine_api.h"

namespace loom {
class Decoder;
}

namespace loom::infer {

// "last" -> Last, "mean" -> Mean; anything else throws loom::Error naming the valid values.
Pooling pooling_from_name(const std::string& name);
const char* pooling_name(Pooling p);

// Throws loom::Error naming the input's index when an input is empty, longer than the model's
// context, or holds an id outside its vocabulary.
void check_embedding_inputs(const std::vector<std::vector<int32_t>>& inputs, int vocab,
                            int max_seq);

// One vector of model.config().d_model floats per input, in order. Inputs are packed into
// forward passes of at most opt.max_batch_tokens tokens (a longer input runs alone); each
// attends only to itself, so a vector does not depend on what it was batched with beyond
// rounding. Pooling sums in double.
std::vector<std::vector<float>> embed(Decoder& model,
                                      const std::vector<std::vector<int32_t>>& inputs,
                                      const EmbeddingOptions& opt = {});

// The pooling alone: rows [n, d] of one sequence's hidden states into out[d].
void pool_hidden(const float* rows, int n, int d, const EmbeddingOptions& opt, float* out);

}  // namespace loom::infer
