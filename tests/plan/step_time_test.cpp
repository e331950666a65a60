// Step-time model: published throughputs within +-15% (one set of efficiencies for every
// row), and the structure of the model (bubble, overlap, links, FLOP accounting).
#include <gtest/gtest.h>

#include <cmath>

#include "plan/plan.h"
#include "plan/validation.h"

using namespace loom::plan;

TEST(PlanStepTime, PublishedThroughputWithin15Percent) {
  int asserted = 0;
  for (const PublishedRow& row : published_rows()) {
    if (!row.asserted) continue;
    ++asserted;
    double pred = predicted_tflops(row);
    EXPECT_NEAR(pred / row.published_tflops, 1.0, 0.15)
        << row.name << ": predicted " << pred << " TFLOP/s, published " << row.published_tflops;
  }
  EXPECT_GE(asserted, 17);  // 10 Megatron-LM A100, 2 NeMo H100, 5 Megatron-Core H100 rows
}

TEST(PlanStepTime, PublishedRunsFitInMemory) {
  for (const PublishedRow& row : published_rows()) {
    if (!row.asserted) continue;
    Plan p = make_plan(row.input);
    EXPECT_TRUE(p.memory.fits()) << row.name << ": " << p.memory.total() / 1e9 << " GB";
  }
}

TEST(PlanStepTime, MegatronFlopFormulaMatchesPaper) {
  // Narayanan et al. eq. (3): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per step, with full
  // recompute and full s^2 attention.
  PublishedRow row = published_rows().back();
  for (const PublishedRow& r : published_rows())
    if (r.name == "megatron-a100 145B") row = r;
  Plan p = make_plan(row.input);
  const ModelSpec& m = row.input.model;
  double B = row.input.train.global_batch, s = m.seq, l = m.layers, h = m.hidden, V = m.vocab;
  double paper = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_NEAR(p.step.hardware_flops_per_step / paper, 1.0, 0.01);
}

namespace {

PlanInput llama70b(int64_t nodes, int64_t tp, int64_t pp, int64_t vp, int64_t gbs) {
  PlanInput in;
  in.model = model_preset("llama3-70b");
  in.cluster = cluster_preset("dgx-h100");
  in.cluster.nodes = nodes;
  in.train.global_batch = gbs;
  in.train.tp = tp;
  in.train.pp = pp;
  in.train.vp = vp;
  return in;
}

}  // namespace

TEST(PlanStepTime, RatesAreConsistent) {
  Plan p = make_plan(llama70b(8, 8, 4, 1, 64));
  const ModelSpec& m = p.in.model;
  EXPECT_NEAR(p.step.tokens_per_s, 64.0 * m.seq / p.step.step, 1e-6 * p.step.tokens_per_s);
  EXPECT_NEAR(p.step.mfu, p.step.model_flops_per_step / p.step.step / 64 / 989e12, 1e-9);
  // Model FLOPs ~ 6 N tokens plus attention.
  double six_n = 6 * count_params(m).total(m) * 64 * m.seq;
  EXPECT_GT(p.step.model_flops_per_step, six_n);
  EXPECT_LT(p.step.model_flops_per_step, 1.2 * six_n);
  EXPECT_NEAR(p.step.step, p.step.pipeline + p.step.p2p + p.step.dp_exposed + p.step.optimizer,
              1e-12);
}

TEST(PlanStepTime, BubbleIsPMinusOneOverVTimesStage) {
  Plan p = make_plan(llama70b(8, 8, 4, 1, 64));
  EXPECT_NEAR(p.step.bubble, 3 * p.step.stage_time, 1e-12);
  Plan v = make_plan(llama70b(8, 8, 4, 5, 64));
  EXPECT_NEAR(v.step.bubble, 3.0 / 5 * v.step.stage_time, 1e-12);
  // Interleaving shrinks the bubble, so the step gets faster.
  EXPECT_LT(v.step.step, p.step.step);
  int64_t m = micro_batches(p.in.train);
  EXPECT_NEAR(p.step.bubble / (p.step.pipeline - p.step.bubble), 3.0 / m, 1e-9);
}

TEST(PlanStepTime, FullRecomputeCostsAForwardPass) {
  PlanInput in = llama70b(8, 8, 4, 1, 64);
  in.train.recompute = Recompute::None;
  Plan none = make_plan(in);
  in.train.recompute = Recompute::Full;
  Plan full = make_plan(in);
  EXPECT_GT(full.step.step, none.step.step * 1.2);
  EXPECT_DOUBLE_EQ(full.step.model_flops_per_step, none.step.model_flops_per_step);
  EXPECT_GT(full.step.hardware_flops_per_step, 1.3 * none.step.hardware_flops_per_step);
  EXPECT_LT(full.memory.activations, none.memory.activations / 5);
}

TEST(PlanStepTime, TensorParallelAcrossNodesGoesOverTheNetwork) {
  Plan in_node = make_plan(llama70b(8, 8, 2, 1, 64));
  Plan across = make_plan(llama70b(8, 16, 1, 1, 64));
  EXPECT_EQ(in_node.step.tp_link, "nvlink");
  EXPECT_EQ(across.step.tp_link, "network");
  EXPECT_GT(across.step.stage_tp_comm / across.step.stage_time,
            3 * in_node.step.stage_tp_comm / in_node.step.stage_time);
}

TEST(PlanStepTime, OverlapHidesDataParallelTraffic) {
  PlanInput in = llama70b(16, 8, 2, 1, 128);
  in.train.overlap_grad_reduce = false;
  in.train.overlap_param_gather = false;
  Plan exposed = make_plan(in);
  in.train.overlap_grad_reduce = true;
  in.train.overlap_param_gather = true;
  Plan hidden = make_plan(in);
  EXPECT_DOUBLE_EQ(exposed.step.dp_exposed, exposed.step.dp_comm);
  EXPECT_LT(hidden.step.dp_exposed, 0.2 * hidden.step.dp_comm);
  EXPECT_EQ(hidden.step.dp_link, "network");
}

TEST(PlanStepTime, GemmEfficiencyGrowsWithShape) {
  ClusterSpec c = cluster_preset("dgx-h100");
  double small = gemm_efficiency(c, Precision::bf16, 1024, 512, 512);
  double big = gemm_efficiency(c, Precision::bf16, 16384, 8192, 8192);
  EXPECT_LT(small, big);
  EXPECT_LT(big, c.gpu.gemm_eff_bf16);
  EXPECT_GT(big, 0.95 * c.gpu.gemm_eff_bf16);
}

TEST(PlanStepTime, Fp8IsFasterThanBf16OnH100) {
  PlanInput in = llama70b(8, 4, 4, 1, 64);
  Plan bf16 = make_plan(in);
  in.train.precision = Precision::fp8;
  Plan fp8 = make_plan(in);
  EXPECT_LT(fp8.step.step, bf16.step.step);
  EXPECT_GT(fp8.step.step, bf16.step.step / 2);  // attention and comm stay bf16
}

TEST(PlanStepTime, MoeAddsAllToAllAndExpertParallelUsesIt) {
  PlanInput in;
  in.model = model_preset("mixtral-8x7b");
  in.cluster = cluster_preset("dgx-h100");
  in.cluster.nodes = 2;
  in.train.global_batch = 64;
  in.train.tp = 2;
  in.train.ep = 8;
  Plan p = make_plan(in);
  EXPECT_GT(p.step.stage_ep_comm, 0);
  EXPECT_GT(p.step.tokens_per_s, 0);
  // Active parameters drive FLOPs: ~6 x active x tokens.
  double active = count_params(in.model).active(in.model);
  EXPECT_NEAR(p.step.model_flops_per_step / (6 * active * 64 * in.model.seq), 1.0, 0.15);
}
