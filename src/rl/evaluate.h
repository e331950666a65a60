// Held-out accuracy: replies to the environment's held-out tasks (Environment::eval_task: for a
// generator, tasks of a seed training never uses; for a task file, the --env-eval-tasks list, at
// most its length), scored by the environment (a reward of 1 is a correct reply); greedy by
// default, or sampled at `temperature` (one reply per task, seeded by the task).
#pragma once

#include <cstdint>

#include "data/bpe.h"
#include "data/chat.h"
#include "model/decoder.h"
#include "rl/env.h"

namespace loom::rl {

// The seed of the held-out tasks of a run trained with `seed`.
uint64_t heldout_seed(uint64_t seed);

double heldout_accuracy(Decoder& model, const data::BpeTokenizer& tok,
                        const data::ChatTemplate& chat, const Environment& env, int tasks,
                        uint64_t seed, int max_tokens, float temperature = 0);

}  // namespace loom::rl
