// Process groups from a rank generator with Megatron's ordering: tensor parallel fastest, then
// context, expert, data, pipeline. A world rank r decomposes as
//   r = tp + TP * (cp + CP * (ep + EP * (edp + (DP / EP) * pp)))
// where the data-parallel coordinate is dp = ep + EP * edp: expert parallelism splits the data-
// parallel dimension (world = TP * CP * DP * PP; EP must divide DP).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace loom {
class Config;
}

namespace loom::comm {

struct ParallelDims {
  int tp = 1, cp = 1, ep = 1, dp = 0, pp = 1;  // dp = 0: whatever the world size leaves
  // Reads [parallel] tp, cp, ep, dp, pp from a config.
  static ParallelDims from(const Config& cfg);
};

struct RankCoords {
  int tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;
};

class RankGenerator {
 public:
  // Resolves dp = 0 and validates: every size positive, world = tp*cp*dp*pp, ep divides dp.
  // Errors name the sizes and the product that failed.
  RankGenerator(int world, ParallelDims dims);

  const ParallelDims& dims() const { return dims_; }
  int world() const { return world_; }
  RankCoords coords(int rank) const;
  int rank_of(const RankCoords& c) const;
  // All groups of a kind, each listing world ranks in group-rank order. `kind` is one of the
  // dimensions (tp, cp, ep, dp, pp) or a '-'-joined combination (tp-cp, dp-cp, tp-dp, ...):
  // ranks that differ only in those coordinates form one group.
  std::vector<std::vector<int>> groups(const std::string& kind) const;
  // The group of `kind` holding `rank`, and the index of that group among groups(kind).
  std::vector<int> group_of(const std::string& kind, int rank, int* index = nullptr) const;

 private:
  ParallelDims dims_;
  int world_;
};

// This rank's coordinates and communicators for each group kind it takes part in.
class ProcessGroups {
 public:
  // Collective over `world`: every rank must construct it with the same dims.
  ProcessGroups(Communicator& world, ParallelDims dims);

  const RankGenerator& generator() const { return gen_; }
  const RankCoords& coords() const { return coords_; }
  Communicator& world() { return world_; }
  Communicator& tp() { return *tp_; }
  Communicator& cp() { return *cp_; }
  Communicator& dp() { return *dp_; }
  Communicator& pp() { return *pp_; }
  Communicator& ep() { return *ep_; }
  // Expert-data parallel: the data-parallel ranks that hold the same experts (dp / ep of them).
  Communicator& edp() { return *edp_; }
  Communicator& tp_dp() { return *tp_dp_; }  // model-parallel x data-parallel (norm reductions)
  // Context-parallel ranks join data parallelism for gradient reduction: dp x cp, and
  // tp x dp x cp for the gradient norm.
  Communicator& dp_cp() { return *dp_cp_; }
  Communicator& tp_dp_cp() { return *tp_dp_cp_; }
  std::string describe() const;

 private:
  Communicator& world_;
  RankGenerator gen_;
  RankCoords coords_;
  std::unique_ptr<Communicator> tp_, cp_, dp_, pp_, ep_, edp_, tp_dp_, dp_cp_, tp_dp_cp_;
};

}  // namespace loom::comm
