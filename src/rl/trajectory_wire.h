// The trajectory message a rollout rank sends the learner for one target step: the scored prompt
// groups (prompt token ids, each completion's tokens, behaviour log-probs, text and reward, the
// weight version that generated them) and the batch's counts (groups dropped for a timeout or by
// the environment, generated tokens, busy seconds), and with partial rollouts the groups cut in
// the batch that the sender continues in its next one (RolloutBatch::carried: each completion's
// tokens so far, versions, and whether it finished or stopped). A flat little-endian byte
// layout (version 3; version 2, without the carried groups and the per-completion marks, as
// older checkpoints hold it, still decodes: every completion finished); decoding
// checks every length against the bytes left, so a truncated or corrupt message is an error
// naming the rank and the byte offset, never a crash or a partial batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rl/rollout.h"

namespace loom::rl {

std::vector<uint8_t> encode_trajectories(const RolloutBatch& b, int64_t target_step);
// `from` names the sender in errors ("rollout rank 2"). Returns the batch; *target_step gets
// the step it was generated for.
RolloutBatch decode_trajectories(const std::vector<uint8_t>& bytes, const std::string& from,
                                 int64_t* target_step);

}  // namespace loom::rl
