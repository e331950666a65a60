// The planner's front door: read a model, a cluster and training settings from a config
// (presets plus overrides), evaluate memory, step time and reliability, and render the result
// as a table or as one JSON object.
#pragma once

#include <string>

#include "core/config.h"
#include "core/json.h"
#include "plan/memory.h"
#include "plan/reliability.h"
#include "plan/step_time.h"

namespace loom::plan {

struct PlanInput {
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
};

// Reads a training config ([model], [parallel], [precision], [train]: the trainer's keys, read
// by the trainer's readers) plus the planner's [cluster] and [plan] sections (docs/plan.md lists
// every key). Presets are applied first (model.preset, cluster.preset, cluster.gpu), then
// explicit fields override them; no cluster at all is one dgx-h100 node. Unknown keys, keys of
// the planner's former dialect (named with their replacement), missing fields and settings the
// planner does not model throw loom::Error naming the key.
PlanInput read_plan_input(const Config& cfg);

struct Plan {
  PlanInput in;
  MemoryBreakdown memory;
  StepBreakdown step;
  Reliability rel;
  double restart_minutes = 0;  // what the goodput model used
  std::string restart_source;  // cluster.restart_minutes, or Loom's measured supervisor
};

// Validates the layout (filling dp) and evaluates everything.
Plan make_plan(PlanInput in, const Efficiency& e = default_efficiency());

// Checkpoint size: weights + optimizer state (gradients are not saved).
double checkpoint_bytes(const ModelSpec& m, const TrainSpec& t);

Json plan_json(const Plan& p);
std::string plan_table(const Plan& p);
std::string layout_string(const TrainSpec& t);  // "tp=8 pp=4 vp=5 cp=1 ep=1 dp=2 mbs=1 ..."

}  // namespace loom::plan
