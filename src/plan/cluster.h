// Hardware: a GPU type (peak FLOP/s, HBM), a node (GPUs joined by NVLink) and a cluster of
// nodes (InfiniBand), with the reliability and storage figures the goodput model needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::plan {

struct GpuSpec {
  std::string name;
  double peak_bf16_tflops = 0;  // dense (no 2:4 sparsity)
  double peak_fp8_tflops = 0;   // 0: no FP8 tensor cores
  double hbm_gb = 0;            // 1e9 bytes
  double hbm_bw_gbs = 0;        // 1e9 bytes/s
  // Fraction of peak that large, well-shaped GEMMs reach on this GPU with its software stack
  // of the time (cuBLAS). Hardware calibration, not per-run tuning: see docs/plan.md.
  double gemm_eff_bf16 = 0.8;
  double gemm_eff_fp8 = 0.6;
  // fp32 GEMM peak; 0: TF32 tensor cores at half the bf16 peak. CPU clusters set it from a
  // measured sgemm (there fp32 is the training precision and uses gemm_eff_bf16's curve).
  double peak_fp32_tflops = 0;
  // GEMM shape constant d0 of this device's efficiency curve; 0: Efficiency::gemm_dim0 (the
  // GPU value). A calibration fits it from measured GEMM shapes (src/plan/calibration.h).
  double gemm_dim0 = 0;
  // Last-level cache per device and the bandwidth elementwise work reaches in it (as the
  // planner counts elementwise bytes); 0: none modelled (GPUs: their L2
  // is small next to one layer's activations). On a CPU the activations of one layer of a
  // small model stay in L3, so elementwise work whose tensors fit runs at this bandwidth.
  double cache_mb = 0;
  double cache_bw_gbs = 0;
};

struct ClusterSpec {
  std::string name = "custom";
  GpuSpec gpu;
  int64_t gpus_per_node = 8;
  int64_t nodes = 1;
  double intra_bw_gbs = 0;  // NVLink, per GPU per direction
  double intra_lat_us = 3;
  double inter_bw_gbs = 0;  // network, per GPU per direction (one NIC per GPU)
  double inter_lat_us = 10;
  // Per GPU, all causes a job sees (GPU, host, network). Default: the Llama 3 report's 419
  // unexpected interruptions in 54 days on 16,384 H100s, i.e. 54*24*16384/419 GPU-hours.
  double gpu_mtbf_hours = 54.0 * 24 * 16384 / 419;
  double ckpt_write_gbs = 1000;  // aggregate checkpoint storage write bandwidth
  // Detect, relaunch, reload. < 0 (the default): Loom's own supervisor, measured
  // (reliability.h: loom_restart_seconds); a cluster file may give its own figure.
  double restart_minutes = -1;
  // Achieved collective bandwidth / the bandwidths above; 0: Efficiency::link_eff_* (nominal
  // link rates). A calibrated cluster file holds measured bus bandwidths and sets 1.
  double link_eff = 0;
  // Rate at which a rank sums received data in all-reduce and reduce-scatter (GB/s); 0: free
  // (GPUs: NCCL's reduction keeps up with the link). On a CPU the cores sum from memory.
  double reduce_bw_gbs = 0;
  double reduce_scatter_bw_gbs = 0;  // the same in reduce-scatter; 0: reduce_bw_gbs
  // false where collectives are memory copies made by the ranks' own cores (MPI over shared
  // memory on a CPU node): then no communication hides under compute, whatever the overlap
  // switches say, because the copies take the same cores the compute needs.
  bool comm_overlaps_compute = true;

  int64_t world() const { return gpus_per_node * nodes; }
};

GpuSpec gpu_preset(const std::string& name);          // a100, a100-40gb, h100, h200, b200
ClusterSpec cluster_preset(const std::string& name);  // dgx-a100, dgx-h100, dgx-h200, dgx-b200
std::vector<std::string> gpu_preset_names();
std::vector<std::string> cluster_preset_names();

void validate(const ClusterSpec& c);

}  // namespace loom::plan
