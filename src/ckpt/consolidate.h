// Consolidation: the per-rank checkpoints of a distributed run (docs/parallel.md, "Distributed
// checkpoints") placed into whole tensors and written as one one-process checkpoint, which
// `loom ckpt export`, `loom generate --ckpt` and a one-process `loom train` read as their own.
//
// A distributed run writes <out_dir>/checkpoints/rank_NNNNN/step_XXXXXXXX/ per rank, every
// tensor a piece of the rank's local parameter (or of its optimizer state) flattened: ZeRO-0 the
// whole local tensor (replicas), ZeRO >= 1 the rank's slice [a, a + n) with ShardInfo
// global_shape {local numel} and global_offset {a}. A rank's local parameter is where its
// tensor-parallel (TP) and expert-parallel (EP) coordinates put it: consolidation builds each
// rank's model for the layout recorded in state.json extra "layout" and places every local
// element where that model's ParamInfo says (model/params.h, global_row_first: a TP shard of the
// fused QKV weight is its query heads' rows, then its key and value heads' rows). Pipeline
// stages hold different parameters under the one-process names (a tied embedding on the first
// and the last stage); context-parallel ranks are data-parallel replicas for the weights.
// Expert tensor parallelism (parallel.etp > 1) is refused.
#pragma once

#include <cstdint>
#include <string>

namespace loom::ckpt {

// The distributed layout a run records in state.json extra "layout", e.g.
// "tp=1 sp=0 cp=1 dp=2 pp=1 zero=1 ep=2 vp=1 stages=1,1" (absent keys keep their defaults).
struct DistributedLayout {
  int tp = 1, cp = 1, dp = 1, pp = 1, ep = 1, zero = 0;
  int world() const { return tp * cp * dp * pp; }
  static DistributedLayout parse(const std::string& text);  // throws on a malformed entry
};

struct ConsolidateOptions {
  std::string input;  // a run directory (holding checkpoints/) or its checkpoints directory
  std::string out;    // the checkpoints root to write: <out>/step_XXXXXXXX and <out>/latest
  int64_t step = -1;  // -1: the newest step that every rank committed
};

struct ConsolidateResult {
  std::string dir;  // the step directory written
  int64_t step = 0;
  int ranks = 0;
  std::string layout;
  // Elements held by several ranks (replicas) whose values differ; the copy of the lowest
  // global offset, then the lowest rank, was taken. 0 for a healthy run.
  int64_t replica_mismatches = 0;
};

// Reads every rank's checkpoint of one step, checks that together they cover every element of
// every model and optimizer tensor (errors name the tensor, the uncovered range, and missing
// ranks or steps), and writes the one-process checkpoint atomically: nothing under `out`
// changes unless every check passed and every file was written.
ConsolidateResult consolidate(const ConsolidateOptions& opt);

}  // namespace loom::ckpt
