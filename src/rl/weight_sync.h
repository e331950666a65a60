// Weight sync between the learner and the rollout ranks: the policy's flat parameter
// buffer in the rollout compute type, preceded by the weight version, as one message that the
// learner broadcasts after each step. bf16 (the default) halves the bytes of fp32; the rollout
// ranks widen it back into their fp32 model, so they sample from the learner's weights rounded
// to bf16 (round to nearest even). fp32 sends the weights exactly, which is what makes a
// max-staleness-0 multi-rank run the synchronous algorithm bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/params.h"

namespace loom::rl {

// Bytes of the message for `numel` parameters in `dtype` (F32 or BF16): version + payload.
int64_t weight_message_bytes(int64_t numel, DType dtype);
// The message: the version (8 bytes) then the parameters converted to `dtype`.
std::vector<uint8_t> pack_weights(const ParamSet& P, DType dtype, int64_t version);
// Writes the message's parameters into P (widened to fp32) and returns its version. Throws
// naming the sizes when the message does not fit P.
int64_t unpack_weights(const std::vector<uint8_t>& msg, DType dtype, ParamSet& P);
// FNV-1a 64 over P's parameters as they are sent in `dtype`: equal on the learner and a rollout
// rank exactly when the rollout rank holds the learner's weights (as sent) bit for bit.
uint64_t weights_hash(const ParamSet& P, DType dtype);
// "f32" / "bf16" -> the dtype; anything else is an error naming the option.
DType weight_sync_dtype(const std::string& name);

}  // namespace loom::rl
