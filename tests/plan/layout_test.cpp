// Bad input: impossible layouts and unknown names fail with messages that say what would fit.
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/layout.h"

using namespace loom::plan;

namespace {

std::string error_of(const ModelSpec& m, ClusterSpec c, TrainSpec t) {
  try {
    resolve_and_validate(m, c, t);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

ClusterSpec h100(int64_t nodes) {
  ClusterSpec c = cluster_preset("dgx-h100");
  c.nodes = nodes;
  return c;
}

TrainSpec layout(int64_t tp, int64_t pp, int64_t gbs) {
  TrainSpec t;
  t.tp = tp;
  t.pp = pp;
  t.global_batch = gbs;
  return t;
}

}  // namespace

TEST(PlanLayout, TensorParallelMustDivideHeads) {
  std::string e = error_of(model_preset("llama3-8b"), h100(1), layout(3, 1, 8));
  EXPECT_NE(e.find("tensor parallel 3 does not divide the 32 attention heads"), std::string::npos)
      << e;
  EXPECT_NE(e.find("valid tp: 1, 2, 4, 8"), std::string::npos) << e;
}

TEST(PlanLayout, LayersMustDivideIntoStages) {
  std::string e = error_of(model_preset("llama3-8b"), h100(3), layout(8, 3, 24));
  EXPECT_NE(e.find("layers: 32 are not divisible by pp x vp = 3 x 1"), std::string::npos) << e;
  // Suggestions are the divisors of 32 that fit the 24 GPUs with tp 8.
  EXPECT_NE(e.find("pp values that divide them: 1, 2;"), std::string::npos) << e;
  TrainSpec t = layout(8, 2, 8);
  t.vp = 3;
  e = error_of(model_preset("llama3-8b"), h100(2), t);
  EXPECT_NE(e.find("pp x vp = 2 x 3"), std::string::npos) << e;
}

TEST(PlanLayout, WorldSizeMustMatch) {
  TrainSpec t = layout(8, 1, 64);
  t.dp = 4;
  std::string e = error_of(model_preset("llama3-8b"), h100(2), t);
  EXPECT_NE(
      e.find("world size mismatch: tp x pp x cp x dp = 8 x 1 x 1 x 4 = 32 but the cluster has 16"),
      std::string::npos)
      << e;
  EXPECT_NE(e.find("leave parallel.dp unset to use dp = 2"), std::string::npos) << e;
  ClusterSpec odd = h100(1);
  odd.gpus_per_node = 6;
  e = error_of(model_preset("llama3-8b"), odd, layout(4, 1, 8));
  EXPECT_NE(e.find("world size 6"), std::string::npos) << e;
}

TEST(PlanLayout, GlobalBatchMustSplitIntoMicroBatches) {
  TrainSpec t = layout(1, 1, 20);
  t.micro_batch = 2;
  std::string e = error_of(model_preset("llama3-8b"), h100(1), t);
  EXPECT_NE(e.find("global batch 20 is not divisible by dp x micro_batch = 8 x 2 = 16"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("nearest valid global batches: 16, 32"), std::string::npos) << e;
}

TEST(PlanLayout, OtherImpossibleSettings) {
  TrainSpec t = layout(1, 1, 8);
  t.precision = Precision::fp8;
  EXPECT_NE(error_of(model_preset("llama3-8b"), cluster_preset("dgx-a100"), t).find("no FP8"),
            std::string::npos);
  t = layout(1, 1, 8);
  t.ep = 2;
  EXPECT_NE(error_of(model_preset("llama3-8b"), h100(1), t).find("has no experts"),
            std::string::npos);
  t = layout(1, 1, 8);
  t.ep = 3;
  EXPECT_NE(error_of(model_preset("mixtral-8x7b"), h100(1), t).find("valid ep: 1, 2, 4, 8"),
            std::string::npos);
  t = layout(1, 1, 8);
  t.zero_stage = 5;
  EXPECT_NE(error_of(model_preset("llama3-8b"), h100(1), t).find("parallel.zero must be 0..3"),
            std::string::npos);
  t = layout(1, 1, 8);
  t.vp = 2;
  EXPECT_NE(error_of(model_preset("llama3-8b"), h100(1), t).find("needs pp > 1"),
            std::string::npos);
}

TEST(PlanLayout, EmbeddingAsLayerAllowsLlama405bOnSixteenStages) {
  TrainSpec t = layout(8, 16, 2048);
  EXPECT_NE(error_of(model_preset("llama3-405b"), h100(1024), t).find("126"), std::string::npos);
  t.pipeline_embedding_as_layer = true;
  EXPECT_EQ(error_of(model_preset("llama3-405b"), h100(1024), t), "");
}

TEST(PlanLayout, UnknownNames) {
  EXPECT_THROW(model_preset("llama9"), loom::Error);
  try {
    gpu_preset("v100");
    FAIL();
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown GPU 'v100' (known: a100"), std::string::npos);
  }
  EXPECT_THROW(cluster_preset("dgx-v100"), loom::Error);
  EXPECT_THROW(parse_precision("int4"), loom::Error);
  EXPECT_THROW(recompute_from_name("some"), loom::Error);
}
