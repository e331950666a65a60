// Calibration arithmetic and parsing (src/plan/calibration.h) and the planner features a
// calibrated CPU cluster uses: a custom device, the fp32 peak, a per-device GEMM shape
// constant, measured link bandwidth, and communication that cannot hide under compute.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/error.h"
#include "plan/calibration.h"
#include "plan/plan.h"

using namespace loom;
using namespace loom::plan;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<GemmSample> curve_samples(double peak, double top, double d0) {
  std::vector<GemmSample> s;
  for (double m : {128.0, 512.0, 2048.0})
    for (double n : {128.0, 1024.0})
      for (double k : {64.0, 768.0}) {
        double eff = top / (1 + d0 * (1 / m + 1 / n + 1 / k));
        s.push_back({m, n, k, peak * eff});
      }
  return s;
}

Calibration sample_calibration() {
  Calibration c;
  c.name = "test-node";
  c.threads_per_rank = 1;
  c.ranks_per_node = 2;
  c.peak_gflops = 60;
  c.gemm = {0.9, 20};
  c.mem_bw_gbs = 10;
  c.mem_gb = 12;
  c.link = {5, 3};
  c.load_avg = 0.4;
  c.gemm_samples = {{1024, 384, 128, 50}};
  return c;
}

// Loom's tiny preset (a GPT-2 shape: 4 x 128, vocabulary 256, sequence 128) in fp32,
// 8 sequences per micro-batch, on `cluster_toml` with the [parallel] keys in `parallel`.
PlanInput cpu_input(const std::string& cluster_toml, const std::string& parallel) {
  std::string toml = cluster_toml + R"(
[model]
preset = "tiny"
[train]
micro_batch = 8
seq_len = 128
[parallel]
)" + parallel;
  return read_plan_input(Config::parse(toml, "cpu.toml"));
}

}  // namespace

TEST(Calibration, GemmFitRecoversTheCurve) {
  GemmCurve c = fit_gemm_curve(curve_samples(60, 0.85, 40), 60);
  EXPECT_NEAR(c.top, 0.85, 1e-9);
  EXPECT_NEAR(c.d0, 40, 1e-6);
}

TEST(Calibration, FlatOrNoisyGemmSamplesGiveNoShapeTerm) {
  // Faster small GEMMs (negative slope): no shape penalty, the harmonic mean efficiency.
  std::vector<GemmSample> s = {{128, 128, 128, 60}, {2048, 2048, 2048, 30}};
  GemmCurve c = fit_gemm_curve(s, 60);
  EXPECT_EQ(c.d0, 0);
  EXPECT_NEAR(c.top, 2 / (1.0 + 2.0), 1e-12);  // efficiencies 1 and 0.5
  // Above the peak is capped at 1.
  GemmCurve capped = fit_gemm_curve({{128, 128, 128, 80}, {256, 256, 256, 90}}, 60);
  EXPECT_LE(capped.top, 1.0);
}

TEST(Calibration, GemmFitNeedsTwoShapesAndPositiveRates) {
  EXPECT_NE(error_of([] {
              fit_gemm_curve({{64, 64, 64, 10}, {64, 64, 64, 11}}, 60);
            }).find("at least two shapes"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              fit_gemm_curve({{64, 64, 64, 10}, {128, 0, 64, 11}}, 60);
            }).find("GEMM sample 1"),
            std::string::npos);
}

TEST(Calibration, LinkFitRecoversBandwidthAndLatency) {
  const double bw = 6e9, lat = 4e-6, sum = 2e9, rs_sum = 0.5e9;
  std::vector<CommSample> s, no_gather;
  for (double b = 4096; b <= 64e6; b *= 4) {
    // g = 2: all-reduce moves 2(g-1)/g = 1 buffer over 2 hops and sums (g-1)/g = 0.5 of it.
    s.push_back({Collective::all_reduce, 2, b, b / bw + 2 * lat + 0.5 * b / sum});
    s.push_back({Collective::all_gather, 2, b, 0.5 * b / bw + lat});
    s.push_back({Collective::reduce_scatter, 4, b, 0.75 * b / bw + 3 * lat + 0.75 * b / rs_sum});
    no_gather.push_back({Collective::all_reduce, 4, b, 1.5 * b / bw + 6 * lat});
  }
  LinkFit f = fit_link(s);
  EXPECT_NEAR(f.bw_gbs, 6, 1e-6);
  EXPECT_NEAR(f.lat_us, 4, 1e-6);
  EXPECT_NEAR(f.reduce_bw_gbs, 2, 1e-6);
  EXPECT_NEAR(f.reduce_scatter_bw_gbs, 0.5, 1e-6);
  // Without all-gather samples the summing rate cannot be told from the link: not fitted.
  LinkFit g = fit_link(no_gather);
  EXPECT_NEAR(g.bw_gbs, 6, 1e-6);
  EXPECT_EQ(g.reduce_bw_gbs, 0);
  EXPECT_EQ(g.reduce_scatter_bw_gbs, 0);
}

TEST(Calibration, LinkFitClampsNegativeLatency) {
  // Pure bandwidth with a small offset below zero: latency 0, bandwidth from the slope.
  std::vector<CommSample> s = {{Collective::all_reduce, 2, 1e6, 1e-4 - 1e-7},
                               {Collective::all_reduce, 2, 1e7, 1e-3 - 1e-7}};
  LinkFit f = fit_link(s);
  EXPECT_EQ(f.lat_us, 0);
  EXPECT_NEAR(f.bw_gbs, 10, 0.1);
  EXPECT_NE(error_of([] {
              fit_link({{Collective::all_reduce, 2, 1e6, 1e-4}});
            }).find("two message sizes"),
            std::string::npos);
}

TEST(Calibration, CommSamplesRoundTripAndErrorsNameTheField) {
  std::vector<CommSample> s = {{Collective::all_reduce, 2, 4096, 6e-6},
                               {Collective::reduce_scatter, 4, 1 << 20, 2e-4}};
  std::vector<CommSample> back = parse_comm_samples(comm_samples_json(s), "comm.json");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].op, Collective::reduce_scatter);
  EXPECT_EQ(back[1].ranks, 4);
  EXPECT_EQ(back[1].bytes, double(1 << 20));
  EXPECT_EQ(back[0].seconds, 6e-6);

  auto err = [](const std::string& text) {
    return error_of([&] { parse_comm_samples(Json::parse(text, "comm.json"), "comm.json"); });
  };
  EXPECT_NE(err(R"({"samples": [{"op": "all_reduce", "ranks": 2, "bytes": 8, "seconds": 1e-6},
                                {"op": "all_reduce", "ranks": 2, "seconds": 1e-6}]})")
                .find("comm.json: samples[1]: missing field 'bytes'"),
            std::string::npos);
  EXPECT_NE(err(R"({"samples": [{"op": "broadcast", "ranks": 2, "bytes": 8, "seconds": 1}]})")
                .find("samples[0].op: unknown collective 'broadcast'"),
            std::string::npos);
  EXPECT_NE(err(R"({"samples": [{"op": "all_gather", "ranks": 2, "bytes": -8, "seconds": 1}]})")
                .find("samples[0].bytes must be positive"),
            std::string::npos);
  EXPECT_NE(err(R"({"rows": []})").find("'samples' array"), std::string::npos);
}

TEST(Calibration, ClusterFileReadsBackIntoThePlanner) {
  PlanInput in = cpu_input(cluster_toml(sample_calibration()), "dp = 1\n");
  const ClusterSpec& c = in.cluster;
  EXPECT_EQ(c.name, "test-node");
  EXPECT_EQ(c.gpus_per_node, 2);
  EXPECT_DOUBLE_EQ(c.gpu.peak_fp32_tflops, 0.06);
  EXPECT_DOUBLE_EQ(c.gpu.gemm_eff_bf16, 0.9);
  EXPECT_DOUBLE_EQ(c.gpu.gemm_dim0, 20);
  EXPECT_DOUBLE_EQ(c.gpu.hbm_bw_gbs, 10);
  EXPECT_DOUBLE_EQ(c.intra_bw_gbs, 5);
  EXPECT_DOUBLE_EQ(c.intra_lat_us, 3);
  EXPECT_DOUBLE_EQ(c.link_eff, 1);
  EXPECT_FALSE(c.comm_overlaps_compute);
  // The per-device shape constant replaces the GPU default in the efficiency curve.
  EXPECT_NEAR(gemm_efficiency(c, Precision::fp32, 100, 100, 100), 0.9 / (1 + 20 * 0.03), 1e-12);
  // Incomplete calibrations are refused.
  Calibration bad = sample_calibration();
  bad.mem_bw_gbs = 0;
  EXPECT_NE(error_of([&] { cluster_toml(bad); }).find("incomplete calibration"), std::string::npos);
  // A custom device without figures names the missing one.
  EXPECT_NE(error_of([] {
              make_plan(cpu_input("[cluster]\ngpu = \"custom\"\n", ""));
            }).find("gpu.peak_bf16_tflops"),
            std::string::npos);
}

TEST(Calibration, Fp32UsesTheMeasuredFp32Peak) {
  // With memory traffic made free, fp32 step time is GEMMs and attention at the fp32 peak:
  // doubling the measured peak halves it (the bf16 peak would be ignored).
  Calibration c = sample_calibration();
  c.mem_bw_gbs = 1e9;
  c.ranks_per_node = 1;
  Plan a = make_plan(cpu_input(cluster_toml(c), "dp = 1\n"));
  c.peak_gflops = 120;
  Plan b = make_plan(cpu_input(cluster_toml(c), "dp = 1\n"));
  EXPECT_NEAR(b.step.step / a.step.step, 0.5, 1e-3);
  EXPECT_GT(a.step.step, 0);
}

TEST(Calibration, CommOnComputeCoresIsNeverHidden) {
  std::string file = cluster_toml(sample_calibration());
  Plan cpu = make_plan(cpu_input(file, "dp = 2\nzero = 0\n"));
  EXPECT_GT(cpu.step.dp_comm, 0);
  EXPECT_DOUBLE_EQ(cpu.step.dp_exposed, cpu.step.dp_comm);
  // The same cluster with overlapping communication hides part of it.
  std::string overlapping = file;
  overlapping.replace(overlapping.find("comm_overlaps_compute = false"), 29,
                      "comm_overlaps_compute = true");
  Plan gpu_like = make_plan(cpu_input(overlapping, "dp = 2\nzero = 0\n"));
  EXPECT_LT(gpu_like.step.dp_exposed, cpu.step.dp_exposed);
  // Ring all-reduce of fp32 gradients over the measured link: B/bw + 2 lat for 2 ranks.
  double grads = count_params(cpu.in.model).total(cpu.in.model) * 4;
  EXPECT_NEAR(cpu.step.dp_comm, grads / 5e9 + 2 * 3e-6, 1e-9);
  // With a summing rate, half the buffer (g = 2) is summed at it.
  Calibration summing = sample_calibration();
  summing.link.reduce_bw_gbs = 2;
  std::string with_sum = cluster_toml(summing);
  EXPECT_NE(with_sum.find("reduce_bw_gbs = 2"), std::string::npos);
  Plan s = make_plan(cpu_input(with_sum, "dp = 2\nzero = 0\n"));
  EXPECT_NEAR(s.step.dp_comm, grads / 5e9 + 2 * 3e-6 + 0.5 * grads / 2e9, 1e-9);
  // ZeRO-1: reduce-scatter of the gradients summed at its own rate, all-gather of the weights.
  summing.link.reduce_scatter_bw_gbs = 1;
  Plan z = make_plan(cpu_input(cluster_toml(summing), "dp = 2\nzero = 1\n"));
  EXPECT_NEAR(z.step.dp_comm, 2 * (0.5 * grads / 5e9 + 3e-6) + 0.5 * grads / 1e9, 1e-9);
}

TEST(Calibration, TensorParallelMessagesUseTheActivationWidth) {
  std::string file = cluster_toml(sample_calibration());
  Plan fp32 = make_plan(cpu_input(file, "tp = 2\ndp = 1\n"));
  PlanInput in = cpu_input(file, "tp = 2\ndp = 1\n");
  in.train.precision = Precision::bf16;
  Plan bf16 = make_plan(in);
  // 4 layers x (forward + backward) x 2 all-reduces of n h activations each.
  const double n = 8 * 128, h = 128, hops_lat = 2 * 3e-6;
  EXPECT_NEAR(fp32.step.stage_tp_comm, 4 * 2 * 2 * (n * h * 4 / 5e9 + hops_lat), 1e-9);
  EXPECT_NEAR(bf16.step.stage_tp_comm, 4 * 2 * 2 * (n * h * 2 / 5e9 + hops_lat), 1e-9);
}

TEST(Calibration, ElementwiseWorkRunsFromCacheWhenALayerFits) {
  Calibration c = sample_calibration();
  c.ranks_per_node = 1;
  const std::string train = "dp = 1\n";
  Plan dram = make_plan(cpu_input(cluster_toml(c), train));
  c.cache_bw_gbs = 100;
  c.cache_mb = 1;  // one layer's activations (8 x 128 tokens x 640 x 4 B = 2.6 MB) do not fit
  Plan too_small = make_plan(cpu_input(cluster_toml(c), train));
  EXPECT_DOUBLE_EQ(too_small.step.step, dram.step.step);
  c.cache_mb = 16;
  Plan cached = make_plan(cpu_input(cluster_toml(c), train));
  EXPECT_DOUBLE_EQ(cached.in.cluster.gpu.cache_bw_gbs, 100);
  EXPECT_LT(cached.step.step, dram.step.step);
  // The optimizer still streams the whole state from memory.
  EXPECT_DOUBLE_EQ(cached.step.optimizer, dram.step.optimizer);
}
