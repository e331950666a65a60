// The rollout side of GRPO: the serving engine samples a group of G completions for each of P
// prompts of one target step from the weights its model holds, and the environment scores them.
// Each completion keeps the log-probabilities its tokens had when sampled (the behaviour policy,
// for the learner's importance weights). A batch has a deadline (rollout_timeout): completions
// still running then are cancelled and their groups dropped and counted, so one stuck rollout
// never stalls the job (NeMo RL #3238). An environment that fails to score a group (HTTP: a
// timeout, a malformed answer) drops that group, counted, and the job goes on.
#pragma once

#include <memory>
#include <vector>

#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "infer/model_runner.h"
#include "model/decoder.h"
#include "rl/env.h"
#include "rl/replay_buffer.h"

namespace loom::rl {

struct RlOptions;

struct RolloutBatch {
  std::vector<PromptGroup> groups;  // finished and scored
  // Over MPI ranks with partial rollouts: the groups the batch cut, which the rank continues in
  // its next batch (target step + 1); sent with the batch so that a checkpoint can keep them.
  std::vector<PromptGroup> carried;
  int64_t dropped_timeout = 0, dropped_env = 0;
  int64_t generated_tokens = 0;
  double seconds = 0;
};

// How many steps ahead of the learner new groups may start. Without partial rollouts that is
// max_staleness; with them a completion of max_tokens takes up to B = ceil(max_tokens /
// partial_tokens) batches (one per step) and a group is as old as its first batch's weights, so
// new groups start at most max_staleness - (B - 1) steps ahead and every group finishes within
// the bound. Throws when B < 2 or max_staleness < B - 1 (no group could finish in time).
int64_t rollout_lead(const RlOptions& opt, int64_t max_staleness);

class RolloutWorker {
 public:
  RolloutWorker(Decoder& model, const data::BpeTokenizer& tok, const data::ChatTemplate& chat,
                const Environment& env, const RlOptions& opt);
  ~RolloutWorker();
  // The groups of `target_step` (its P tasks are fixed by the seed and the step), sampled from
  // the model's current weights, tagged `version`. With parts > 1 only the prompts i with
  // i % parts == part (one rollout rank's share of the step; the rest come from other ranks).
  // Partial rollouts (RlOptions::partial_tokens > 0): each completion generates at most that
  // many tokens in this batch; the groups with a completion cut there come back in *carry
  // (retargeted to the next step) and are passed to the next call, which continues them from
  // its (newer) weights: prompt + the tokens so far, each new token tagged with its version.
  RolloutBatch generate(int64_t target_step, int64_t version, int part = 0, int parts = 1,
                        std::vector<PromptGroup>* carry = nullptr);
  // The model's weights changed: drops cached prefixes (their keys and values are stale).
  void weights_updated() { engine_->weights_updated(); }

 private:
  const data::BpeTokenizer& tok_;
  const data::ChatTemplate& chat_;
  const Environment& env_;
  const RlOptions& opt_;
  std::unique_ptr<infer::DecoderRunner> runner_;
  std::unique_ptr<infer::LoomEngine> engine_;
};

}  // namespace loom::rl
