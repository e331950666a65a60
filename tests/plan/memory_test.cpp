// Memory formulas against hand-computed cases.
#include <gtest/gtest.h>

#include "plan/memory.h"
#include "plan/plan.h"

using namespace loom::plan;

namespace {

ClusterSpec nodes(const char* preset, int64_t n) {
  ClusterSpec c = cluster_preset(preset);
  c.nodes = n;
  return c;
}

TrainSpec layout(int64_t tp, int64_t pp, int64_t gbs, int64_t mbs = 1) {
  TrainSpec t;
  t.tp = tp;
  t.pp = pp;
  t.global_batch = gbs;
  t.micro_batch = mbs;
  return t;
}

}  // namespace

TEST(PlanMemory, EighteenBytesPerParamUnshardedMixedPrecisionAdam) {
  // Seed fact: bf16 params 2 + fp32 grads 4 + fp32 master 4 + Adam m 4 + v 4.
  StateBytes s = state_bytes(Precision::bf16, Optimizer::adam, true);
  EXPECT_DOUBLE_EQ(s.weight, 2);
  EXPECT_DOUBLE_EQ(s.grad, 4);
  EXPECT_DOUBLE_EQ(s.optimizer, 12);
  EXPECT_DOUBLE_EQ(bytes_per_param(s, 0, 64), 18);
}

TEST(PlanMemory, DistributedOptimizerIsSixPlusTwelveOverD) {
  StateBytes s = state_bytes(Precision::bf16, Optimizer::adam, true);
  for (double d : {1.0, 2.0, 8.0, 64.0, 1024.0}) {
    EXPECT_DOUBLE_EQ(bytes_per_param(s, 1, d), 6 + 12 / d) << d;
    EXPECT_DOUBLE_EQ(bytes_per_param(s, 2, d), 2 + 16 / d) << d;
    EXPECT_DOUBLE_EQ(bytes_per_param(s, 3, d), 18 / d) << d;
  }
  // fp32 training has no master copy: 4 + 4 + 8.
  EXPECT_DOUBLE_EQ(bytes_per_param(state_bytes(Precision::fp32, Optimizer::adam, true), 0, 1), 16);
  // SGD with momentum keeps one moment: 2 + 4 + (4 + 4).
  EXPECT_DOUBLE_EQ(bytes_per_param(state_bytes(Precision::bf16, Optimizer::sgd, true), 0, 1), 14);
}

TEST(PlanMemory, Nemotron4StateIs6120GB) {
  // Seed fact: 18 bytes x 340B = 6,120 GB; the preset's own count is within 1% of 340B.
  StateBytes s = state_bytes(Precision::bf16, Optimizer::adam, true);
  EXPECT_DOUBLE_EQ(18 * 340e9 / 1e9, 6120);
  ModelSpec m = model_preset("nemotron4-340b");
  double params = count_params(m).total(m);
  EXPECT_NEAR(params / 340e9, 1.0, 0.01);
  EXPECT_NEAR(params * bytes_per_param(s, 0, 1) / 1e9, 6120, 0.01 * 6120);
}

TEST(PlanMemory, ParameterCountsOfKnownModels) {
  ModelSpec gpt2 = model_preset("gpt2-124m");
  EXPECT_DOUBLE_EQ(count_params(gpt2).total(gpt2), 124439808.0);  // the GPT-2 small count
  struct {
    const char* name;
    double billions;
  } known[] = {{"llama3-8b", 8.03},
               {"llama3-70b", 70.55},
               {"llama3-405b", 405.85},
               {"megatron-1t", 1008},
               {"gpt3-175b", 175}};
  for (auto& k : known) {
    ModelSpec m = model_preset(k.name);
    EXPECT_NEAR(count_params(m).total(m) / 1e9 / k.billions, 1.0, 0.015) << k.name;
  }
  // Narayanan et al. eq. (2): P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).
  for (const char* name : {"megatron-1.7b", "megatron-18b", "megatron-145b", "megatron-1t"}) {
    ModelSpec m = model_preset(name);
    double l = m.layers, h = m.hidden, V = m.vocab, s = m.seq;
    double paper = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    EXPECT_NEAR(count_params(m).total(m) / paper, 1.0, 1e-3) << name;
  }
  ModelSpec mix = model_preset("mixtral-8x7b");
  ParamCounts pc = count_params(mix);
  EXPECT_NEAR(pc.total(mix) / 1e9, 46.7, 0.3);
  EXPECT_NEAR(pc.active(mix) / 1e9, 12.9, 0.2);
}

TEST(PlanMemory, KorthikantiActivationFormulas) {
  // GPT-style layer (MHA, 4h GeLU MLP, dropout, unfused attention, 16-bit): bytes per token
  // = h (34 + 5 a s / h) unsharded; TP: h (10 + 24/t + 5as/(ht)); TP+SP: h/t (34 + 5as/h);
  // selective + SP: 34 h / t; full: 2h (SP: 2h/t).
  ModelSpec m = model_preset("megatron-18b");
  const double h = m.hidden, a = m.heads, s = m.seq;
  TrainSpec t = layout(1, 1, 8);
  t.flash_attention = false;
  t.precision = Precision::fp16;
  EXPECT_DOUBLE_EQ(activation_bytes_per_token_layer(m, t, Recompute::None),
                   h * (34 + 5 * a * s / h));
  t.tp = 8;
  t.sequence_parallel = false;
  EXPECT_DOUBLE_EQ(activation_bytes_per_token_layer(m, t, Recompute::None),
                   h * (10 + 24.0 / 8 + 5 * a * s / (h * 8)));
  t.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(activation_bytes_per_token_layer(m, t, Recompute::None),
                   h / 8 * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(activation_bytes_per_token_layer(m, t, Recompute::Selective), 34 * h / 8);
  EXPECT_DOUBLE_EQ(activation_bytes_per_token_layer(m, t, Recompute::Full), 2 * h / 8);
  t.sequence_parallel = false;
  EXPECT_DOUBLE_EQ(activation_bytes_per_token_layer(m, t, Recompute::Full), 2 * h);
  // Flash attention drops the s^2 terms, leaving a fp32 log-sum-exp per head.
  t.flash_attention = true;
  EXPECT_DOUBLE_EQ(activation_bytes_per_token_layer(m, t, Recompute::None),
                   h * (10 + 24.0 / 8) + 4 * a / 8);
}

TEST(PlanMemory, PipelineKeepsPMicroBatchesInFlightAndInterleavingAddsOneOverV) {
  ModelSpec m = model_preset("llama3-70b");  // no dropout: activations are layer terms only
  ClusterSpec c = nodes("dgx-h100", 8);
  TrainSpec t = layout(4, 4, 64);  // dp 4, 16 micro-batches per step
  t.recompute = Recompute::None;
  resolve_and_validate(m, c, t);
  const double n = m.seq * 1.0;
  const double per_layer = n * activation_bytes_per_token_layer(m, t, Recompute::None);
  StageParams first = stage_params(m, t, Stage::first);
  MemoryBreakdown mem = memory_per_gpu(m, c, t);
  ASSERT_STREQ(mem.worst_stage, "first");
  // 1F1B: p micro-batches of L/p layers = L layers' worth.
  EXPECT_NEAR(mem.activations, per_layer * first.layers * 4, 1e-6 * mem.activations);
  EXPECT_EQ(first.layers * 4, m.layers);
  // Interleaved: L (1 + (p-1)/(p v)).
  t.vp = 5;
  MemoryBreakdown inter = memory_per_gpu(m, c, t);
  EXPECT_NEAR(inter.activations, per_layer * m.layers * (1 + 3.0 / (4 * 5)),
              1e-6 * inter.activations);
  // Fewer micro-batches than stages: only those are in flight.
  TrainSpec few = layout(4, 4, 8);
  few.recompute = Recompute::None;
  resolve_and_validate(m, c, few);
  EXPECT_EQ(micro_batches(few), 2);
  EXPECT_NEAR(memory_per_gpu(m, c, few).activations, per_layer * first.layers * 2,
              1e-6 * mem.activations);
}

TEST(PlanMemory, ShardingSplitsWeightsAndOptimizerState) {
  ModelSpec m = model_preset("llama3-70b");
  ClusterSpec c = nodes("dgx-h100", 8);
  TrainSpec t = layout(8, 1, 64);
  t.zero_stage = 0;
  resolve_and_validate(m, c, t);
  MemoryBreakdown z0 = memory_per_gpu(m, c, t);
  double shard = stage_params(m, t, Stage::first).total();
  EXPECT_NEAR(shard / (count_params(m).total(m) / 8), 1.0, 0.01);  // TP splits ~all params
  EXPECT_DOUBLE_EQ(z0.weights, shard * 2);
  EXPECT_DOUBLE_EQ(z0.optimizer, shard * 12);
  t.zero_stage = 1;
  MemoryBreakdown z1 = memory_per_gpu(m, c, t);
  EXPECT_DOUBLE_EQ(z1.optimizer, shard * 12 / 8);
  EXPECT_DOUBLE_EQ(z1.grads, z0.grads);
  t.zero_stage = 3;
  MemoryBreakdown z3 = memory_per_gpu(m, c, t);
  EXPECT_DOUBLE_EQ(z3.weights, shard * 2 / 8);
}

TEST(PlanMemory, FitsOrNot) {
  ModelSpec m = model_preset("llama3-70b");
  // One DGX H100: 70B x 18 bytes / 8 GPUs is ~160 GB per GPU with replicated state.
  ClusterSpec one = nodes("dgx-h100", 1);
  TrainSpec t = layout(8, 1, 8);
  t.zero_stage = 0;
  resolve_and_validate(m, one, t);
  MemoryBreakdown mem = memory_per_gpu(m, one, t);
  EXPECT_FALSE(mem.fits());
  EXPECT_GT(mem.total(), 150e9);
  // Eight nodes, TP 8 x PP 4, distributed optimizer: fits.
  ClusterSpec eight = nodes("dgx-h100", 8);
  TrainSpec ok = layout(8, 4, 64);
  resolve_and_validate(m, eight, ok);
  EXPECT_TRUE(memory_per_gpu(m, eight, ok).fits());
}

TEST(PlanMemory, ExpertParallelShardsExperts) {
  ModelSpec m = model_preset("mixtral-8x7b");
  ClusterSpec c = nodes("dgx-h100", 1);
  TrainSpec t = layout(1, 1, 8);
  resolve_and_validate(m, c, t);
  double e1 = stage_params(m, t, Stage::first).experts;
  t.ep = 8;
  double e8 = stage_params(m, t, Stage::first).experts;
  EXPECT_DOUBLE_EQ(e1 / e8, 8);
}
