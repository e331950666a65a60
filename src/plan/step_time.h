// Step time: compute from FLOPs over peak times a GEMM-shape-dependent efficiency, memory-bound
// elementwise work, TP/SP/CP/EP/DP(ZeRO) communication over the links each group crosses minus
// what overlaps, the pipeline bubble (p-1)/(v m) and point-to-point transfers, the optimizer.
#pragma once

#include <string>

#include "plan/layout.h"

namespace loom::plan {

// One set of efficiencies for every prediction (docs/plan.md lists how they were chosen).
// Per-GPU GEMM efficiency lives in GpuSpec.
struct Efficiency {
  // GEMM efficiency = gpu.gemm_eff / (1 + d0 (1/M + 1/N + 1/K)): small dimensions waste tiles
  // and waves and lower arithmetic intensity.
  double gemm_dim0 = 128;
  // Attention core (flash) reaches this fraction of the GPU's GEMM efficiency.
  double attention_rel = 0.75;
  // Bytes of HBM traffic per element of the hidden-size and MLP-activation tensors in one
  // layer's forward (norms, residual adds, bias/activation, dropout, casts); backward x2.
  double elementwise_bytes = 16;
  // Achieved collective bus bandwidth / nominal link bandwidth.
  double link_eff_intra = 0.80;
  double link_eff_inter = 0.85;
  double tp_overlap = 0.6;  // share of TP traffic hidden when tp_comm_overlap is on
  double dp_overlap = 0.9;  // most of DP traffic that can hide under compute
};
const Efficiency& default_efficiency();

struct StepBreakdown {
  // Per micro-batch, bottleneck pipeline stage (seconds).
  double stage_compute = 0;  // GEMM + attention + elementwise (+ recompute)
  double stage_tp_comm = 0;  // exposed TP/SP collectives
  double stage_cp_comm = 0;  // exposed context-parallel KV exchange
  double stage_ep_comm = 0;  // MoE all-to-all
  double stage_time = 0;     // sum of the above, all virtual chunks
  // Per step (seconds).
  double pipeline = 0;    // (m + (p-1)/v) * stage_time
  double bubble = 0;      // (p-1)/v * stage_time
  double p2p = 0;         // pipeline sends on the critical path
  double dp_comm = 0;     // total DP/ZeRO traffic time
  double dp_exposed = 0;  // the part not hidden under compute
  double optimizer = 0;
  double step = 0;
  // Rates.
  double tokens_per_s = 0;
  double model_flops_per_step = 0;     // 3 x forward, no recompute (MFU's numerator)
  double hardware_flops_per_step = 0;  // + recompute
  double tflops_per_gpu = 0;           // model FLOPs
  double hw_tflops_per_gpu = 0;        // hardware FLOPs (Megatron-LM's convention)
  double mfu = 0;
  // Where each group's traffic goes.
  std::string tp_link, cp_link, ep_link, dp_link, pp_link;
};

StepBreakdown step_time(const ModelSpec& m, const ClusterSpec& c, const TrainSpec& t,
                        const Efficiency& e = default_efficiency());

// GEMM efficiency for an M x K by K x N product on this GPU at this precision.
double gemm_efficiency(const ClusterSpec& c, Precision p, double M, double N, double K,
                       const Efficiency& e = default_efficiency());

}  // namespace loom::plan
