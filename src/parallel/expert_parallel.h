// Expert parallelism's token exchange, applied to the MoE layers from outside
// (model/parallel_ops.h's ExpertExchange): the rows each rank routed to another rank's experts
// travel there with an all-to-all (blocks padded to the largest count over the EP group) and
// come back with a second one; under expert tensor parallelism the experts' partial outputs
// and input gradients are all-reduced over the ETP group. The rows move as backend buffers:
// packing and unpacking are Backend copies, and the collectives take the backend's memory
// (device memory under NCCL); only the per-expert counts of the plan pass through the host.
#pragma once

#include <memory>

#include "model/moe_layer.h"

namespace loom::parallel {

// The exchange for `ep` (its communicators set) over E experts of width C on `be`'s buffers.
std::unique_ptr<ExpertExchange> make_expert_exchange(const ExpertParallel& ep, Backend& be, int E,
                                                     int C);

}  // namespace loom::parallel
