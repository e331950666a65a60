// Tensor and expert parallelism inside the RL learners (mpi_grpo.h, --learner-tp, --learner-ep,
// --learner-etp): the learners train a shard of the policy (the trainer's layout,
// parallel/tensor_parallel.h: TP splits heads, MLPs and vocabulary; EP splits the experts over
// data-parallel groups; ETP splits each expert's width over TP ranks), while the rollout ranks,
// the checkpoints and the evaluation read the whole model. These move parameter-shaped buffers
// between the two: a shard cut from whole tensors, and whole tensors assembled from the shards
// of a group of learners that together hold every element (the weight sync after each step, the
// optimizer moments for a checkpoint). The assembly copies values, never sums them, so the whole
// tensors hold exactly the shards' bits.
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
// (with sequence parallelism when `sp`), the experts split over `ep` data-parallel groups and
// each expert's width over `etp` of the TP ranks, for `cfg`; throws naming the numbers (and the
// model field that does not split, or the MoE settings SP's padding would change).
void check_learner_grid(int learners, int tp, const ModelConfig& cfg, bool sp = false, int ep = 1,
                        int etp = 1);

// Which parameters of a shard this learner contributes to the whole model, so that every element
// comes from exactly one learner of the gathering group: a TP-split parameter from the learners
// of EP rank 0, a replicated one from TP rank 0 of EP rank 0, an expert weight from the ETP ranks
// of the first ETP group (tp_rank < etp) of every EP rank.
std::vector<char> owned_params(const ParamSet& shard, int tp_rank, int etp, int ep_rank);

// shard's parameters <- their local pieces of the same-named whole tensors of `whole`.
void extract_shard(ParamSet& whole, ParamSet& shard);

// The optimizer state: shard's moments <- their pieces of whole's (a resume), and the step count.
void extract_shard_state(AdamW& whole, Optimizer& shard, const ParamSet& shard_params);

class TpGather {
 public:
  // Collective over `group` (every rank passes its shard of the same model and what it owns,
  // owned_params): exchanges where each rank's elements sit in the whole tensors.
  TpGather(const ParamSet& shard, comm::Communicator& group, const std::vector<char>& owned);
  // The local (shard-shaped) and whole buffers of a parameter, e.g. its weights or a moment.
  using Local = std::function<const float*(const ParamInfo&)>;
  using Whole = std::function<float*(const ParamInfo&)>;
  // Collective over `tp`: on every rank, whole(p) <- p's whole tensor, pieced together from
  // every rank's local(p), for every parameter p of the shard.
  void gather(const Local& local, const Whole& whole);
  // Collective over `tp`: whole's moments and step count <- the shards' (a checkpoint).
  void gather_state(Optimizer& shard, AdamW& whole);

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
