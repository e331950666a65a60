// Published training throughputs the planner is checked against (docs/plan.md, tests/plan).
// Each row carries the run's published inputs; the prediction uses the default efficiencies,
// the same for every row.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"

namespace loom::plan {

struct PublishedRow {
  std::string name;
  std::string source;
  PlanInput input;
  double published_tflops = 0;  // per GPU, in the source's FLOP convention
  double published_mfu = 0;     // when the source reports MFU: published_tflops = mfu x bf16 peak
  bool hardware_flops = false;  // true: the source counts recompute FLOPs (Megatron-LM 2021)
  // false: shown, not tested, because the missing inputs decide the result (Llama 3 rows).
  // Rows with assumed inputs that are asserted say so in `note` and in docs/plan.md.
  bool asserted = true;
  std::string note;  // inputs that were assumed rather than published
};

std::vector<PublishedRow> published_rows();

// Predicted per-GPU TFLOP/s in the row's convention.
double predicted_tflops(const PublishedRow& row, const Efficiency& e = default_efficiency());

}  // namespace loom::plan
