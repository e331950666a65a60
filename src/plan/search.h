// `loom plan --search`: enumerate the valid layouts of a model on a cluster, drop those that do
// not fit in memory, rank the rest by predicted throughput and explain why the winner wins.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"

namespace loom::plan {

struct SearchOptions {
  std::vector<int64_t> micro_batches = {1, 2, 4, 8};
  std::vector<Recompute> recomputes = {Recompute::None, Recompute::Selective, Recompute::Full};
  int64_t max_vp = 8;
  int64_t max_cp = 16;
};

struct Candidate {
  TrainSpec train;
  MemoryBreakdown memory;
  StepBreakdown step;
};

struct SearchResult {
  std::vector<Candidate> ranked;  // fitting layouts, fastest first
  int64_t enumerated = 0;         // layouts generated
  int64_t invalid = 0;            // rejected by layout rules (divisibility, batch)
  int64_t not_fitting = 0;        // valid but over the GPU's memory
  std::string explanation;
};

// `base` supplies everything the search does not vary (global batch, precision, optimizer,
// ZeRO, overlap switches); tp, pp, vp, cp, ep, micro_batch and recompute are searched. A base
// without a global batch fixes micro_batch x grad_accum x dp of its own layout, which must
// then be valid.
SearchResult search_layouts(const ModelSpec& m, const ClusterSpec& c, const TrainSpec& base,
                            const SearchOptions& opt = {},
                            const Efficiency& e = default_efficiency());

}  // namespace loom::plan
