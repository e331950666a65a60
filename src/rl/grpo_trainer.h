// GRPO in one process, synchronous (max staleness 0): each step the serving engine samples a
// group of G completions for each of P prompts from the current weights, the environment scores
// them, group-relative advantages are formed, and the learner takes one AdamW step on the GRPO
// loss through the model's per-token loss weights. Groups whose rewards are all equal carry no
// gradient and are counted. The asynchronous split into rollout and learner ranks with a
// versioned replay buffer builds on this (issue 15); this is its max_staleness = 0 reference.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "infer/model_runner.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "rl/env.h"
#include "rl/grpo.h"

namespace loom::rl {

struct RlOptions {
  int prompts_per_step = 8, group_size = 8, max_tokens = 16;
  float temperature = 1.0f;
  double lr = 1e-5, clip_grad = 1.0;
  AdamWConfig adam;
  GrpoConfig grpo;
  uint64_t seed = 1;
};

struct RlStepStats {
  int64_t step = 0;
  double reward_mean = 0, reward_std = 0, accuracy = 0, response_length = 0;
  double loss = 0, kl = 0, clip_fraction = 0, grad_norm = 0;
  int64_t groups = 0, zero_advantage_groups = 0, train_tokens = 0;
  double rollout_seconds = 0, learner_seconds = 0, generation_tokens_per_s = 0;
  Json json() const;
};

class GrpoTrainer {
 public:
  // The policy is trained in place; a reference copy is kept only when grpo.beta > 0.
  GrpoTrainer(Decoder& policy, const data::BpeTokenizer& tok, const data::ChatTemplate& chat,
              const Environment& env, const RlOptions& opt);
  RlStepStats step();
  int64_t steps_taken() const { return step_; }

 private:
  Decoder& policy_;
  const data::BpeTokenizer& tok_;
  const data::ChatTemplate& chat_;
  const Environment& env_;
  RlOptions opt_;
  std::unique_ptr<Decoder> reference_;
  std::unique_ptr<AdamW> optim_;
  std::unique_ptr<infer::DecoderRunner> runner_;
  std::unique_ptr<infer::LoomEngine> engine_;
  int64_t step_ = 0;
};

}  // namespace loom::rl
