// `loom rl` checkpoints: the policy as a whole checkpoint (generate and serve read it like any),
// the AdamW state, and in state.json the step, rl_adam_steps, rl_weight_version,
// rl_max_staleness and, from an asynchronous run (one process or MPI ranks), rl_replay_buffer:
// the groups generated ahead of the learner (by older weights) that it had not trained on yet,
// so that a resumed run trains on the same samples as an uninterrupted one instead of
// regenerating them from newer weights. With partial rollouts also rl_partial_groups: the groups
// whose completions were cut and not finished at the checkpoint (their tokens so far, each with
// the weight version that made it), which a resume continues where the uninterrupted run would.
// The buffer is kept in state.json (hex of the
// trajectory messages of trajectory_wire.h, one per target step) so that the checkpoint's commit
// record covers it: a save is atomic and a flipped byte is caught like any other.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/json.h"
#include "model/decoder.h"
#include "optim/optimizer.h"
#include "rl/grpo_trainer.h"
#include "rl/replay_buffer.h"

namespace loom::rl {

struct RlCheckpointInfo {
  std::string config_text;  // the starting checkpoint's config (its model and tokenizer)
  std::string fingerprint;  // the model's config fingerprint
  std::string description;  // state.json "rl": what was trained, from what
  int64_t max_staleness = 0;
  std::string precision = "fp32";  // the policy's precision.policy
  Json loss_scaler;                // fp16: the loss scaler's state (null otherwise)
};

// `optim`'s state (Optimizer::state_slices, each a whole parameter's: one process's engine at
// ZeRO-0, or an AdamW over a whole parameter set) by name, shaped like the parameters of `P`;
// a sliced state (ZeRO >= 1) is refused naming the parameter.
std::map<std::string, Tensor> whole_state_tensors(Optimizer& optim, const ParamSet& P);

// Writes <root>/step_N (N = step: the learner steps taken, the weights' version); returns it.
// `carried`: the partial rollouts' unfinished groups, all of one target step (the first step a
// resume generates).
std::string save_rl_checkpoint(const std::string& root, int64_t step, const RlCheckpointInfo& info,
                               Decoder& policy, Optimizer& optim,
                               const std::vector<BufferedStep>& buffer,
                               const std::vector<PromptGroup>& carried = {});

// An RL checkpoint opened for a resume.
struct RlResumePoint {
  std::string dir;
  int64_t step = 0;
  std::vector<BufferedStep> buffer;  // empty for synchronous runs
  std::vector<PromptGroup> carried;  // partial rollouts' unfinished groups (one target step)
  RlRestore restore;                 // writes the policy and optimizer, returns step
};

// Opens the step directory `dir` (state.json must be a loom rl one and the model's fingerprint
// `fingerprint`); a malformed buffer is an error naming the checkpoint and the byte.
RlResumePoint open_rl_checkpoint(const std::string& dir, const std::string& fingerprint);

// Checks a resume's unfinished groups (partial rollouts) against the step the rollouts start
// at (`first`, check_resume_buffer's) and the run's --partial-tokens; throws naming both.
void check_resume_carry(const std::vector<PromptGroup>& carried, int64_t first, int partial_tokens);

// Checks a resume's buffered steps for a run resuming at learner step `step` with `prompts`
// prompts a step: every step holds its prompts (groups + dropped; a step a partial-rollout run
// marked complete may hold fewer) and they cover the steps from `step` to the last without a gap.
// Returns the first target step the rollouts must generate: after the last buffered one, at
// least `step`. Throws naming the step otherwise (--prompts changed, a corrupt buffer).
int64_t check_resume_buffer(const std::vector<BufferedStep>& buffer, int64_t step, int64_t prompts);

// The buffer's encoding in state.json (exposed for tests): hex of length-prefixed trajectory
// messages. `where` names the checkpoint in errors.
std::string encode_replay_buffer(const std::vector<BufferedStep>& buffer);
std::vector<BufferedStep> decode_replay_buffer(const std::string& hex, const std::string& where);

}  // namespace loom::rl
