// Memory per GPU: weights, gradients and optimizer state by precision and ZeRO stage;
// activations by Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models") generalised to GQA, gated MLPs, MoE and flash attention; the pipeline's
// in-flight micro-batches (interleaving included); communication buffers and runtime reserve.
#pragma once

#include "plan/layout.h"

namespace loom::plan {

// Bytes per parameter for each kind of state, before sharding.
struct StateBytes {
  double weight = 2, grad = 4, optimizer = 12;  // bf16 + fp32 grads + (fp32 master, m, v)
  double total() const { return weight + grad + optimizer; }
};
StateBytes state_bytes(Precision p, Optimizer o, bool grad_fp32);
// Bytes per parameter on one GPU when state is sharded over d data-parallel ranks.
double bytes_per_param(const StateBytes& s, int zero_stage, double d);

// Parameters held by one GPU of a pipeline stage (after TP, PP and EP sharding).
struct StageParams {
  double dense = 0;    // replicated over dp*cp ranks
  double experts = 0;  // replicated over dp*cp/ep ranks
  int64_t layers = 0;  // transformer layers on this stage (all virtual chunks)
  bool has_embedding = false, has_output = false;
  double total() const { return dense + experts; }
};
enum class Stage { first, last };
StageParams stage_params(const ModelSpec& m, const TrainSpec& t, Stage which);

// Activation bytes one transformer layer keeps for backward, per token (Korthikanti Table 2
// terms; `recompute` picks which of them are stored).
double activation_bytes_per_token_layer(const ModelSpec& m, const TrainSpec& t, Recompute r);

struct MemoryBreakdown {
  double weights = 0, grads = 0, optimizer = 0, activations = 0, comm_buffers = 0, reserve = 0;
  double capacity = 0;
  const char* worst_stage = "first";
  double total() const {
    return weights + grads + optimizer + activations + comm_buffers + reserve;
  }
  bool fits() const { return total() <= capacity; }
};

// Bytes on the GPU of the fuller of the first and last pipeline stages.
MemoryBreakdown memory_per_gpu(const ModelSpec& m, const ClusterSpec& c, const TrainSpec& t);

}  // namespace loom::plan
