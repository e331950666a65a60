// Which decoder layers each pipeline stage holds. Stages are the S = v*p virtual stages in
// global order (stage s = chunk*p + rank, see pipeline_schedule.h); stage s holds the
// contiguous layer range [begin, end). By default the layers split evenly; the first and last
// stage's counts can be set on their own (the first also runs the embedding, the last the LM
// head and loss, so giving them fewer layers balances the pipeline), and the other stages then
// split the rest evenly.
#pragma once

#include <vector>

namespace loom::pp {

struct LayerRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};

struct StageLayout {
  int p = 1, v = 1, n_layers = 0;
  std::vector<LayerRange> stages;  // stages[s], s = chunk*p + rank

  const LayerRange& of(int rank, int chunk) const { return stages[chunk * p + rank]; }
  int stage_of_layer(int layer) const;  // throws loom::Error when out of range
};

// first_stage_layers / last_stage_layers < 0: not set (even split). With one stage both, when
// set, must equal n_layers. Throws loom::Error naming the values and what would work when the
// layers do not divide (e.g. "24 layers do not split evenly into 5 stages (p=5 x v=1); use a
// layer count divisible by 5 (20 or 25) or set first/last stage sizes").
StageLayout assign_layers(int n_layers, int p, int v = 1, int first_stage_layers = -1,
                          int last_stage_layers = -1);

}  // namespace loom::pp
