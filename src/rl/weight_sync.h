// Weight sync between the learner and the rollout ranks: the policy's flat parameter
// buffer in the rollout compute type with its weight version (a typed field, sent as its own
// int64 ahead of the payload), a message the learner broadcasts after each step. bf16 (the default)
// halves the bytes of fp32; the rollout ranks widen it back into their fp32 model, so they sample
// from the learner's weights rounded to bf16 (round to nearest even). fp32 sends the weights
// exactly, which is what makes a max-staleness-0 multi-rank run the synchronous algorithm bit for
// bit.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/params.h"

namespace loom::rl {

struct WeightMessage {
  int64_t version = 0;           // the learner steps the weights are after
  std::vector<uint8_t> payload;  // the parameters converted to the sync's dtype
};

// Bytes of the payload for `numel` parameters in `dtype` (F32 or BF16).
int64_t weight_payload_bytes(int64_t numel, DType dtype);
// The message of P's parameters in `dtype` at `version`.
WeightMessage pack_weights(const ParamSet& P, DType dtype, int64_t version);
// Writes the message's parameters into P (widened to fp32) and returns its version. Throws
// naming the sizes when the payload does not fit P, or a negative version.
int64_t unpack_weights(const WeightMessage& msg, DType dtype, ParamSet& P);
// FNV-1a 64 over P's parameters as they are sent in `dtype`: equal on the learner and a rollout
// rank exactly when the rollout rank holds the learner's weights (as sent) bit for bit.
uint64_t weights_hash(const ParamSet& P, DType dtype);
// "f32" / "bf16" -> the dtype; anything else is an error naming the option.
DType weight_sync_dtype(const std::string& name);

}  // namespace loom::rl
