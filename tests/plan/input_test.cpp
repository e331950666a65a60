// Reading plans from config text (the trainer's keys plus [cluster] and [plan]), and the JSON
// interface scripts rely on.
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/plan.h"
#include "train/trainer.h"

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
[parallel]
tp = 8
pp = 4
vp = 5
sp = true
zero = 1
[precision]
policy = "bf16"
[plan]
global_batch = 128
[train]
micro_batch = 1
recompute = "selective"
)";

}  // namespace

TEST(PlanInput, PresetsAndOverrides) {
  loom::Config cfg = loom::Config::parse(kGood, "plan.toml");
  cfg.set_override("train.seq_len=4096");
  PlanInput in = read_plan_input(cfg);
  EXPECT_EQ(in.model.hidden, 8192);
  EXPECT_EQ(in.model.seq, 4096);
  EXPECT_EQ(in.cluster.world(), 64);
  Plan p = make_plan(in);
  EXPECT_EQ(p.in.train.dp, 2);
  EXPECT_EQ(p.in.train.global_batch, 128);
  // A planner preset keeps its own sequence length unless train.seq_len says otherwise.
  EXPECT_EQ(read_plan_input(loom::Config::parse(kGood, "plan.toml")).model.seq, 8192);
}

TEST(PlanInput, TrainerKeysMeanWhatTheyMeanToTheTrainer) {
  // Loom's tiny preset: the GPT-2 family's GeLU MLP, learned positions, tied embeddings, biases.
  PlanInput in = read_plan_input(loom::Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 8\n[train]\nmicro_batch = 4\ngrad_accum = 3\n"
      "seq_len = 64\nrecompute = \"full\"\n[parallel]\ntp = 2\nsp = true\nzero = 2\n"
      "grad_reduce_dtype = \"bf16\"\n[precision]\npolicy = \"fp16\"\n",
      "plan.toml"));
  EXPECT_EQ(in.model.name, "tiny");
  EXPECT_EQ(in.model.layers, 8);
  EXPECT_EQ(in.model.hidden, 128);
  EXPECT_FALSE(in.model.gated_mlp);
  EXPECT_TRUE(in.model.learned_positions);
  EXPECT_TRUE(in.model.tied_embeddings);
  EXPECT_TRUE(in.model.bias);
  EXPECT_EQ(in.model.seq, 64);
  EXPECT_EQ(in.model.positions, 128);  // model.max_seq rows, as the trainer allocates
  EXPECT_EQ(in.train.tp, 2);
  EXPECT_TRUE(in.train.sequence_parallel);
  EXPECT_EQ(in.train.zero_stage, 2);
  EXPECT_EQ(in.train.precision, Precision::fp16);
  EXPECT_EQ(in.train.recompute, loom::Recompute::Full);
  // No cluster: one DGX H100 node; the global batch is micro_batch x grad_accum x dp.
  EXPECT_EQ(in.cluster.world(), 8);
  Plan p = make_plan(in);
  EXPECT_EQ(p.in.train.dp, 4);
  EXPECT_EQ(p.in.train.global_batch, 4 * 3 * 4);
  // The llama family: SwiGLU, RoPE (no position table), untied, no biases.
  in = read_plan_input(loom::Config::parse("[model]\npreset = \"tiny-llama\"\n", "plan.toml"));
  EXPECT_TRUE(in.model.gated_mlp);
  EXPECT_FALSE(in.model.learned_positions);
  EXPECT_FALSE(in.model.bias);
  EXPECT_EQ(in.model.kv_heads, 2);
  // An fp8 recipe is the planner's fp8 precision.
  in = read_plan_input(
      loom::Config::parse("[precision]\npolicy = \"bf16\"\nfp8_recipe = \"mxfp8\"\n", "plan.toml"));
  EXPECT_EQ(in.train.precision, Precision::fp8);
  EXPECT_EQ(in.train.fp8_recipe, Fp8Recipe::mxfp8);
}

TEST(PlanInput, DefaultsAreTheTrainers) {
  const loom::TrainOptions trainer;
  PlanInput in = read_plan_input(loom::Config());
  EXPECT_EQ(in.model.name, "tiny");
  EXPECT_EQ(in.train.micro_batch, trainer.micro_batch);
  EXPECT_EQ(in.train.grad_accum, trainer.grad_accum);
  EXPECT_EQ(in.model.seq, trainer.seq_len);
  EXPECT_EQ(in.train.zero_stage, loom::parallel::DataParallelOptions{}.zero);
  EXPECT_EQ(in.train.precision, Precision::fp32);
  EXPECT_EQ(in.train.recompute, loom::Recompute::None);
  EXPECT_FALSE(in.train.sequence_parallel);
}

TEST(PlanInput, SettingsThePlannerDoesNotModelAreRefused) {
  for (const char* bad :
       {"[parallel]\netp = 2\n", "[parallel]\npp = 2\npp_first_stage_layers = 1\n",
        "[parallel]\npp_schedule = \"gpipe\"\n", "[train]\nmode = \"dpo\"\n",
        "[model]\npreset = \"tiny-moe\"\nmoe_layer_freq = 2\n", "[lora]\nrank = 8\n"}) {
    std::string e = error_of(bad);
    EXPECT_NE(e, "") << bad;
  }
  EXPECT_NE(error_of("[parallel]\netp = 2\n").find("parallel.etp"), std::string::npos);
  EXPECT_NE(error_of("[train]\nmode = \"dpo\"\n").find("train.mode"), std::string::npos);
  // Keys that do not change a prediction are accepted, as in a training config.
  EXPECT_EQ(error_of("[train]\nsteps = 10\nout_dir = \"x\"\n[data]\nsource = \"text\"\n"
                     "[optim]\nlr = 1e-3\n"),
            "");
}

TEST(PlanInput, FormerPlannerKeysAreRefusedNamingTheirReplacement) {
  std::string e = error_of("[model]\nlayers = 2\n");
  EXPECT_NE(e.find("plan.toml:2: 'model.layers' is no longer read"), std::string::npos) << e;
  EXPECT_NE(e.find("use model.n_layer"), std::string::npos) << e;
  e = error_of("[train]\ntp = 2\n");
  EXPECT_NE(e.find("use parallel.tp"), std::string::npos) << e;
  e = error_of("[train]\nglobal_batch = 8\n");
  EXPECT_NE(e.find("plan.global_batch"), std::string::npos) << e;
  e = error_of("[train]\nprecision = \"fp8\"\n");
  EXPECT_NE(e.find("precision.fp8_recipe"), std::string::npos) << e;
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

TEST(PlanInput, CustomShapesUseTheTrainersFields) {
  std::string e = error_of(
      "[model]\nfamily = \"llama\"\nn_layer = 2\nd_model = 256\nn_head = 4\nd_ff = 1024\n"
      "vocab = 1000\n[cluster]\ngpu = \"h100\"\nintra_bw_gbs = 450\ninter_bw_gbs = 50\n"
      "gpus_per_node = 4\n");
  EXPECT_EQ(e, "");
  e = error_of("[model]\nn_layer = 0\n");
  EXPECT_NE(e.find("model.n_layer must be positive"), std::string::npos) << e;
  e = error_of("[train]\nseq_len = 4096\n");
  EXPECT_NE(e.find("train.seq_len (4096) exceeds model.max_seq (128)"), std::string::npos) << e;
}

TEST(PlanInput, MalformedConfigsNameTheProblem) {
  EXPECT_NE(error_of("[model\n").find("plan.toml:1"), std::string::npos);
  std::string e = error_of(std::string(kGood) + "tpp = 2\n");
  EXPECT_NE(e.find("plan.toml:20: unknown config key 'train.tpp'"), std::string::npos) << e;
  EXPECT_NE(e.find("valid keys: train.micro_batch, train.grad_accum"), std::string::npos) << e;
  e = error_of("[parallel]\ntpp = 2\n");
  EXPECT_NE(e.find("parallel.tp,"), std::string::npos) << e;
  e = error_of("[train]\nrecompute = \"most\"\n");
  EXPECT_NE(e.find("unknown recompute 'most'"), std::string::npos) << e;
  e = error_of("[model]\npreset = \"gpt5\"\n");
  EXPECT_NE(e.find("unknown model preset 'gpt5'"), std::string::npos) << e;
  e = error_of("[model]\npreset = \"llama3-8b\"\n[cluster]\nnodes = 2\n");
  EXPECT_NE(e.find("missing field 'cluster.preset'"), std::string::npos) << e;
  e = error_of("[plan]\nglobal_batch = 0\n");
  EXPECT_NE(e.find("plan.toml:2: plan.global_batch must be positive"), std::string::npos) << e;
  e = error_of("[plan]\nglobal_batch = 8\n[train]\ngrad_accum = 2\n");
  EXPECT_NE(e.find("are both set"), std::string::npos) << e;
  e = error_of(std::string(kGood) + "seq_len = \"two\"\n");
  EXPECT_NE(e.find("plan.toml:20: 'train.seq_len' must be an integer"), std::string::npos) << e;
  // A bare word is not a TOML value: a syntax error naming the line, column and the line's text.
  e = error_of(std::string(kGood) + "seq_len = two\n");
  EXPECT_NE(e.find("plan.toml:20:"), std::string::npos) << e;
  EXPECT_NE(e.find("seq_len = two"), std::string::npos) << e;
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
