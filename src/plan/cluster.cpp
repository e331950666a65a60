#include "plan/cluster.h"

#include <map>

#include "core/error.h"

namespace loom::plan {

namespace {

// Datasheet figures (dense bf16/fp8, HBM). gemm_eff_*: see docs/plan.md "Efficiencies".
const std::map<std::string, GpuSpec>& gpus() {
  static const std::map<std::string, GpuSpec> all = {
      {"a100", {"a100", 312, 0, 80, 2039, 0.74, 0}},
      {"a100-40gb", {"a100-40gb", 312, 0, 40, 1555, 0.74, 0}},
      {"h100", {"h100", 989, 1979, 80, 3350, 0.72, 0.60}},
      {"h200", {"h200", 989, 1979, 141, 4800, 0.72, 0.60}},
      {"b200", {"b200", 2250, 4500, 180, 8000, 0.72, 0.60}},
  };
  return all;
}

ClusterSpec dgx(const char* name, const char* gpu, double nvlink, double ib) {
  ClusterSpec c;
  c.name = name;
  c.gpu = gpu_preset(gpu);
  c.gpus_per_node = 8;
  c.nodes = 1;
  c.intra_bw_gbs = nvlink;
  c.inter_bw_gbs = ib;
  return c;
}

// NVLink per direction: A100 300 GB/s (NVLink 3), H100/H200 450 GB/s (NVLink 4), B200 900 GB/s
// (NVLink 5). One InfiniBand NIC per GPU: HDR 200 Gb/s on DGX A100, NDR 400 Gb/s after.
// Per-GPU MTBF: ClusterSpec's default (from the Llama 3 report) for every preset.
const std::map<std::string, ClusterSpec>& clusters() {
  static const std::map<std::string, ClusterSpec> all = {
      {"dgx-a100", dgx("dgx-a100", "a100", 300, 25)},
      {"dgx-h100", dgx("dgx-h100", "h100", 450, 50)},
      {"dgx-h200", dgx("dgx-h200", "h200", 450, 50)},
      {"dgx-b200", dgx("dgx-b200", "b200", 900, 50)},
  };
  return all;
}

template <typename M>
std::string names_of(const M& m) {
  std::string s;
  for (auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k;
  return s;
}

}  // namespace

GpuSpec gpu_preset(const std::string& name) {
  auto it = gpus().find(name);
  LOOM_CHECK(it != gpus().end(), "unknown GPU '", name, "' (known: ", names_of(gpus()),
             "; or custom with every figure in the file)");
  return it->second;
}

ClusterSpec cluster_preset(const std::string& name) {
  auto it = clusters().find(name);
  LOOM_CHECK(it != clusters().end(), "unknown cluster preset '", name,
             "' (known: ", names_of(clusters()), ")");
  return it->second;
}

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> v;
  for (auto& [k, g] : gpus()) v.push_back(k);
  return v;
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> v;
  for (auto& [k, c] : clusters()) v.push_back(k);
  return v;
}

void validate(const ClusterSpec& c) {
  auto pos = [&](double v, const char* field) {
    LOOM_CHECK(v > 0, "cluster '", c.name, "': field '", field, "' must be positive, got ", v);
  };
  pos(c.gpu.peak_bf16_tflops, "gpu.peak_bf16_tflops");
  pos(c.gpu.hbm_gb, "gpu.hbm_gb");
  pos(c.gpu.hbm_bw_gbs, "gpu.hbm_bw_gbs");
  pos(double(c.gpus_per_node), "gpus_per_node");
  pos(double(c.nodes), "nodes");
  pos(c.intra_bw_gbs, "intra_bw_gbs");
  pos(c.inter_bw_gbs, "inter_bw_gbs");
  pos(c.gpu_mtbf_hours, "gpu_mtbf_hours");
  pos(c.ckpt_write_gbs, "ckpt_write_gbs");
  LOOM_CHECK(c.restart_minutes >= 0 || c.restart_minutes == -1, "cluster '", c.name,
             "': restart_minutes must be >= 0 (or -1: Loom's measured supervisor restart)");
  LOOM_CHECK(c.gpu.peak_fp32_tflops >= 0 && c.gpu.gemm_dim0 >= 0 && c.gpu.cache_mb >= 0 &&
                 c.gpu.cache_bw_gbs >= 0,
             "cluster '", c.name,
             "': peak_fp32_tflops, gemm_dim0, cache_mb and cache_bw_gbs must be >= 0 (0: default)");
  LOOM_CHECK(c.reduce_bw_gbs >= 0 && c.reduce_scatter_bw_gbs >= 0, "cluster '", c.name,
             "': reduce_bw_gbs and reduce_scatter_bw_gbs must be >= 0 (0: free / same)");
  LOOM_CHECK(c.link_eff >= 0 && c.link_eff <= 1, "cluster '", c.name,
             "': link_eff must be in [0, 1] (0: default), got ", c.link_eff);
  LOOM_CHECK(c.gpu.gemm_eff_bf16 > 0 && c.gpu.gemm_eff_bf16 <= 1, "cluster '", c.name,
             "': gpu.gemm_eff_bf16 must be in (0, 1]");
}

}  // namespace loom::plan
