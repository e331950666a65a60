// Reading plans from config text, and the JSON interface scripts rely on.
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/plan.h"

using namespace loom::plan;

namespace {

std::string error_of(const std::string& toml) {
  try {
    make_plan(read_plan_input(loom::Config::parse(toml, "plan.toml")));
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

const char* kGood = R"(
[model]
preset = "llama3-70b"
[cluster]
preset = "dgx-h100"
nodes = 8
[train]
global_batch = 128
tp = 8
pp = 4
vp = 5
)";

}  // namespace

TEST(PlanInput, PresetsAndOverrides) {
  loom::Config cfg = loom::Config::parse(kGood, "plan.toml");
  cfg.set_override("model.seq=4096");
  PlanInput in = read_plan_input(cfg);
  EXPECT_EQ(in.model.hidden, 8192);
  EXPECT_EQ(in.model.seq, 4096);
  EXPECT_EQ(in.cluster.world(), 64);
  Plan p = make_plan(in);
  EXPECT_EQ(p.in.train.dp, 2);
}

TEST(PlanInput, JsonHasTheFieldsScriptsUse) {
  Plan p = make_plan(read_plan_input(loom::Config::parse(kGood, "plan.toml")));
  loom::Json j = loom::Json::parse(plan_json(p).dump());
  for (const char* k :
       {"memory_per_gpu_gb", "step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_NEAR(j.at("step_time_s").as_double() / p.step.step, 1.0, 1e-6);
  EXPECT_NEAR(j.at("memory_per_gpu_gb").as_double() / (p.memory.total() / 1e9), 1.0, 1e-6);
  EXPECT_TRUE(j.at("memory").at("fits").as_bool());
  EXPECT_TRUE(j.at("reliability").contains("daly_interval_s"));
  std::string table = plan_table(p);
  EXPECT_NE(table.find("MFU"), std::string::npos);
  EXPECT_NE(table.find("fits"), std::string::npos);
}

TEST(PlanInput, CustomModelNeedsAllFields) {
  std::string e = error_of(
      "[model]\nlayers = 2\n[cluster]\npreset = \"dgx-h100\"\n[train]\nglobal_batch = 8\n");
  EXPECT_NE(e.find("missing field 'model.hidden'"), std::string::npos) << e;
  e = error_of(
      "[model]\nlayers = 2\nhidden = 256\nheads = 4\nffn = 1024\nvocab = 1000\nseq = 128\n"
      "[cluster]\ngpu = \"h100\"\nintra_bw_gbs = 450\ninter_bw_gbs = 50\ngpus_per_node = 4\n"
      "[train]\nglobal_batch = 8\n");
  EXPECT_EQ(e, "");
}

TEST(PlanInput, MalformedConfigsNameTheProblem) {
  EXPECT_NE(error_of("[model\n").find("plan.toml:1"), std::string::npos);
  std::string e = error_of(std::string(kGood) + "tpp = 2\n");
  EXPECT_NE(e.find("plan.toml:12: unknown config key 'train.tpp'"), std::string::npos) << e;
  EXPECT_NE(e.find("valid keys: train.global_batch, train.micro_batch"), std::string::npos) << e;
  EXPECT_NE(e.find("train.tp,"), std::string::npos) << e;
  e = error_of(std::string(kGood) + "recompute = \"most\"\n");
  EXPECT_NE(e.find("unknown recompute 'most'"), std::string::npos) << e;
  e = error_of(
      "[model]\npreset = \"gpt5\"\n[cluster]\npreset = \"dgx-h100\"\n[train]\nglobal_batch = 8\n");
  EXPECT_NE(e.find("unknown model preset 'gpt5'"), std::string::npos) << e;
  e = error_of("[model]\npreset = \"llama3-8b\"\n[cluster]\npreset = \"dgx-h100\"\n");
  EXPECT_NE(e.find("missing field 'train.global_batch'"), std::string::npos) << e;
  e = error_of("[model]\npreset = \"llama3-8b\"\n[train]\nglobal_batch = 8\n");
  EXPECT_NE(e.find("missing field 'cluster.preset'"), std::string::npos) << e;
  e = error_of(std::string(kGood) + "micro_batch = \"two\"\n");
  EXPECT_NE(e.find("plan.toml:12: 'train.micro_batch' must be an integer"), std::string::npos) << e;
  // A bare word is not a TOML value: a syntax error naming the line, column and the line's text.
  e = error_of(std::string(kGood) + "micro_batch = two\n");
  EXPECT_NE(e.find("plan.toml:12:"), std::string::npos) << e;
  EXPECT_NE(e.find("micro_batch = two"), std::string::npos) << e;
}

TEST(PlanInput, ExampleConfigsLoadAndFit) {
  for (const char* f : {"llama3-70b-h100.toml", "megatron-1t-a100.toml", "custom-cluster.toml",
                        "mixtral-8x7b-h100.toml"}) {
    std::string path = std::string(LOOM_SOURCE_DIR) + "/configs/plan/" + f;
    Plan p = make_plan(read_plan_input(loom::Config::load(path)));
    EXPECT_TRUE(p.memory.fits()) << f;
    EXPECT_GT(p.step.mfu, 0.2) << f;
    EXPECT_LT(p.step.mfu, 0.7) << f;
  }
}
