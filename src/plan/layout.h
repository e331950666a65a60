// Training settings and the parallel layout: batch sizes, precision, optimizer, ZeRO stage,
// recompute, TP/PP/VP/CP/EP/DP and the overlap switches. validate() rejects impossible
// layouts with a message that says what would fit instead.
#pragma once

#include <cstdint>
#include <string>

#include "core/recompute.h"
#include "plan/cluster.h"
#include "plan/model.h"

namespace loom::plan {

// The one Recompute of the model (core/recompute.h), spelled plan::Recompute here too.
using loom::Recompute;
using loom::recompute_from_name;
using loom::recompute_name;

enum class Precision { fp32, bf16, fp16, fp8 };
// The FP8 recipe of precision fp8 (the trainer's precision.fp8_recipe names; issue 18).
enum class Fp8Recipe { delayed, current, mxfp8 };
enum class Optimizer { adam, sgd, adam8bit };

struct TrainSpec {
  int64_t global_batch = 0;  // sequences per optimizer step; 0: micro_batch x grad_accum x dp
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;  // micro-batches per step when global_batch is 0
  Precision precision = Precision::bf16;
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed;  // precision fp8 only (TE's default on Hopper)
  Optimizer optimizer = Optimizer::adam;
  int zero_stage =
      1;  // 0 replicated, 1 optimizer state sharded (distributed optimizer), 2 +grads, 3 +weights
  Recompute recompute = Recompute::Selective;
  int64_t tp = 1, pp = 1, vp = 1, cp = 1, ep = 1;
  int64_t dp = 0;                    // 0: world / (tp*pp*cp)
  bool sequence_parallel = true;     // only meaningful with tp > 1
  bool overlap_grad_reduce = true;   // DP gradient reduction hidden under backward
  bool overlap_param_gather = true;  // distributed-optimizer all-gather under forward
  bool tp_comm_overlap = false;      // TP collectives pipelined with GEMMs
  bool flash_attention = true;       // fused attention: no s^2 activations, causal skips half
  bool grad_fp32 = true;             // main gradients (and their reduction) in fp32
  // Treat the embedding and the loss as one layer each when splitting layers over pipeline
  // stages (Megatron's --account-for-embedding/loss-in-pipeline-split): (layers+2) % (pp*vp).
  bool pipeline_embedding_as_layer = false;
  // Reporting convention for attention FLOPs: causal attention counted as half of s^2.
  bool causal_flops = true;
};

const char* name(Precision p);
const char* name(Optimizer o);
const char* name(Fp8Recipe r);
Precision parse_precision(const std::string& s);  // throws listing valid values
Optimizer parse_optimizer(const std::string& s);
Fp8Recipe parse_fp8_recipe(const std::string& s);

// Fills dp when 0 and checks every constraint; throws loom::Error with a suggestion.
void resolve_and_validate(const ModelSpec& m, const ClusterSpec& c, TrainSpec& t);

// Derived counts.
int64_t micro_batches(const TrainSpec& t);                       // per DP rank per step
int64_t pipeline_slots(const ModelSpec& m, const TrainSpec& t);  // layers (+2) to split
int64_t world_size(const TrainSpec& t);

}  // namespace loom::plan
