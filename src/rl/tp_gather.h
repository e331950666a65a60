// Tensor parallelism inside the RL learners (mpi_grpo.h, --learner-tp): the learners train a
// tensor-parallel shard of the policy (the trainer's layout, parallel/tensor_parallel.h), while
// the rollout ranks, the checkpoints and the evaluation read the whole model. These move
// parameter-shaped buffers between the two: a shard cut from whole tensors, and whole tensors
// assembled from every TP rank's shard (the weight sync after each step, the optimizer moments
// for a checkpoint). The assembly copies values, never sums them, so the whole tensors hold
// exactly the shards' bits.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "model/model_config.h"
#include "model/params.h"
#include "optim/adamw.h"

namespace loom::rl {

// Checks a grid of `learners` learner ranks as data-parallel groups of `tp` tensor-parallel ranks
// (with sequence parallelism when `sp`) for `cfg`; throws naming the numbers (and the model field
// that does not split, or the MoE settings SP's padding would change).
void check_learner_grid(int learners, int tp, const ModelConfig& cfg, bool sp = false);

// shard's parameters <- their local pieces of the same-named whole tensors of `whole`.
void extract_shard(ParamSet& whole, ParamSet& shard);

// The optimizer state: shard's moments <- their pieces of whole's (a resume), and the step count.
void extract_shard_state(AdamW& whole, AdamW& shard, const ParamSet& shard_params);

class TpGather {
 public:
  // Collective over `tp` (every rank passes its shard of the same model): exchanges where each
  // rank's elements sit in the whole tensors. Replicated parameters come from TP rank 0.
  TpGather(const ParamSet& shard, comm::Communicator& tp);
  // The local (shard-shaped) and whole buffers of a parameter, e.g. its weights or a moment.
  using Local = std::function<const float*(const ParamInfo&)>;
  using Whole = std::function<float*(const ParamInfo&)>;
  // Collective over `tp`: on every rank, whole(p) <- p's whole tensor, pieced together from
  // every rank's local(p), for every parameter p of the shard.
  void gather(const Local& local, const Whole& whole);
  // Collective over `tp`: whole's moments and step count <- the shards' (a checkpoint).
  void gather_state(AdamW& shard, AdamW& whole);

 private:
  struct Run {
    int64_t param, local, global, length;  // elements [local, +length) -> whole [global, ...)
  };
  const ParamSet& shard_;
  comm::Communicator& tp_;
  std::vector<std::vector<Run>> runs_;  // per TP rank
  std::vector<int64_t> counts_;         // elements each rank sends
  std::vector<float> buf_;
};

}  // namespace loom::rl
