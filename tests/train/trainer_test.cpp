// The training application end to end on a tiny model: determinism, bit-identical resume,
// fp16 loss scaling, bf16 storage, checkpoint validation and config errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/tfevents_reader.h"
#include "kernels/cpu/gemm_bf16.h"
#include "parallel/data_parallel.h"
#include "temp_dir.h"
#include "train/trainer.h"
#include "train/trainer_setups.h"

using namespace loom;

namespace {

// A fresh directory removed when the test ends, pass or fail.
std::string test_dir(const std::string& name) {
  return loom::test::scoped_dir("trainer_" + name);
}

Config tiny_config(const std::string& dir, int steps) {
  Config c = Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 2\nd_model = 32\nn_head = 2\nmax_seq = 32\n"
      "[train]\nmicro_batch = 2\nseq_len = 16\ngrad_accum = 2\nquiet = true\n"
      "peak_gflops = 100\nkeep_last = 2\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\n",
      "test.toml");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.out_dir", "\"" + dir + "/run\"", "test");
  c.set("data.paths", "\"" + test::write_fox_corpus(dir, 200) + "\"", "test");
  return c;
}

std::vector<float> params_of(Trainer& t) {
  auto& P = t.model().params();
  // (read_values: the bf16 policy's 2-byte weights keep no fp32 values; widened from bf16.)
  std::vector<float> v(size_t(P.total()));
  P.read_values(0, P.total(), v.data());
  return v;
}

}  // namespace

TEST(Trainer, SameSeedRunsAreBitIdentical) {
  std::string d1 = test_dir("det1"), d2 = test_dir("det2");
  Trainer a(tiny_config(d1, 4)), b(tiny_config(d2, 4));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.train_step().loss, b.train_step().loss);
  auto pa = params_of(a), pb = params_of(b);
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * 4));
}

TEST(Trainer, ResumeIsBitIdentical) {
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    std::string d1 = test_dir(std::string("resume_straight_") + precision);
    std::string d2 = test_dir(std::string("resume_split_") + precision);
    Config c1 = tiny_config(d1, 6), c2 = tiny_config(d2, 6);
    c1.set("precision.policy", precision, "test");
    c2.set("precision.policy", precision, "test");
    c2.set("train.checkpoint_interval", "3", "test");
    Trainer straight(c1);
    straight.run();
    {
      Trainer t(c2);  // the same 6-step schedule, stopped by hand after 3 steps
      for (int i = 0; i < 3; ++i) t.train_step();
      t.save_checkpoint();
    }
    Trainer resumed(c2);
    EXPECT_EQ(resumed.step(), 3);
    resumed.run();
    auto a = params_of(straight), b = params_of(resumed);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << precision;
    // The metrics logs agree step by step too.
    std::ifstream la(d1 + "/run/metrics.jsonl"), lb(d2 + "/run/metrics.jsonl");
    std::string x, y;
    std::vector<double> losses_a, losses_b;
    while (std::getline(la, x)) losses_a.push_back(Json::parse(x).at("loss").as_double());
    while (std::getline(lb, y)) losses_b.push_back(Json::parse(y).at("loss").as_double());
    ASSERT_EQ(losses_a.size(), 6u);
    ASSERT_EQ(losses_b.size(), 3u);  // the resumed run logs steps 4..6
    for (int i = 0; i < 3; ++i) EXPECT_EQ(losses_a[3 + i], losses_b[i]) << precision;
  }
}

TEST(Trainer, MetricsAreAlsoTensorBoardScalars) {
  std::string d = test_dir("tensorboard");
  Config c = tiny_config(d, 3);
  c.set("train.eval_interval", "3", "test");
  Trainer(c).run();
  std::vector<std::string> files;
  for (auto& e : std::filesystem::directory_iterator(d + "/run/tensorboard"))
    files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u);
  auto events = test::read_events(files[0]);
  ASSERT_EQ(events.size(), 5u);  // file version, 3 steps, 1 evaluation
  std::ifstream log(d + "/run/metrics.jsonl");
  std::string line;
  for (size_t i = 1; std::getline(log, line); ++i) {
    Json j = Json::parse(line);
    EXPECT_EQ(events[i].step, j.at("step").as_int());
    const char* key = j.contains("loss") ? "loss" : "valid_loss";
    EXPECT_EQ(events[i].scalars.at(key), static_cast<float>(j.at(key).as_double())) << line;
    EXPECT_EQ(events[i].scalars.count("step"), 0u);
  }
  c.set("train.tensorboard", "false", "test");
  c.set("train.out_dir", "\"" + d + "/run_plain\"", "test");
  Trainer(c).run();
  EXPECT_FALSE(std::filesystem::exists(d + "/run_plain/tensorboard"));
}

TEST(Trainer, LossDecreasesOnText) {
  std::string d = test_dir("learns");
  Config c = tiny_config(d, 40);
  Trainer t(c);
  double first = t.train_step().loss;
  double last = t.run();
  EXPECT_NEAR(first, std::log(256.0), 0.3);
  EXPECT_LT(last, first - 1.5);
}

TEST(Trainer, Fp16OverflowSkipsStepAndBacksOff) {
  std::string d = test_dir("fp16");
  Config c = tiny_config(d, 4);
  c.set("precision.policy", "\"fp16\"", "test");
  Trainer t(c);
  double scale0 = t.loss_scaler().scale();
  auto before = params_of(t);
  t.inject_gradient_factor(INFINITY);
  StepResult r = t.train_step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(t.loss_scaler().scale(), scale0 / 2);
  EXPECT_EQ(t.loss_scaler().skipped_steps(), 1);
  auto after = params_of(t);
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * 4));
  t.inject_gradient_factor(1.f);
  EXPECT_FALSE(t.train_step().skipped);
  // Weights of an fp16 model are fp16 values.
  for (float w : params_of(t)) ASSERT_EQ(w, round_f16(w));
}

TEST(Trainer, GradNormIsTheUnscaledGlobalNorm) {
  // The first step's gradient norm is the same under fp32 and under fp16 with a loss scale of
  // 2^16 (the scale is divided out), up to fp16 rounding of the activations.
  std::string d1 = test_dir("norm32"), d2 = test_dir("norm16");
  Config c1 = tiny_config(d1, 2), c2 = tiny_config(d2, 2);
  c2.set("precision.policy", "\"fp16\"", "test");
  Trainer a(c1), b(c2);
  StepResult ra = a.train_step(), rb = b.train_step();
  EXPECT_GT(ra.grad_norm, 0.1);
  EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 0.02 * ra.grad_norm);
  // And it is the L2 norm over every parameter's gradient.
  auto& P = a.model().params();
  double sq = 0;
  for (int64_t i = 0; i < P.total(); ++i) sq += double(P.grad()[i]) * P.grad()[i];
  EXPECT_NEAR(std::sqrt(sq), ra.grad_norm, 1e-6 * ra.grad_norm);
}

TEST(Trainer, Bf16WeightsAreBf16Values) {
  std::string d = test_dir("bf16");
  Config c = tiny_config(d, 3);
  c.set("precision.policy", "\"bf16\"", "test");
  Trainer t(c);
  t.run();
  for (float w : params_of(t)) ASSERT_EQ(w, round_bf16(w));
}

TEST(Trainer, ConfigErrorsNameTheField) {
  std::string d = test_dir("cfg");
  auto expect_error = [&](const std::string& key, const std::string& value,
                          const std::string& needle) {
    Config c = tiny_config(d, 2);
    c.set(key, value, "test");
    try {
      Trainer t(c);
      FAIL() << "no error for " << key << "=" << value;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("train.stpes", "3", "train.stpes");
  expect_error("model.n_head", "3", "model.n_head");
  expect_error("model.n_kv_head", "3", "model.n_kv_head");
  expect_error("train.seq_len", "64", "train.seq_len");
  expect_error("precision.policy", "\"fp8\"", "precision");
  expect_error("optim.schedule", "\"exp\"", "optim.schedule");
}

// A run of `key = value` over the checkpoint of a 2-step run with the default settings must be
// refused with an error containing `message`.
static void expect_resume_refused(const std::string& name, const std::string& key,
                                  const std::string& value, const std::string& message) {
  std::string d = test_dir(name);
  Config c = tiny_config(d, 2);
  Trainer(c).run();
  Config other = c;
  other.set(key, value, "test");
  try {
    Trainer t(other);
    ADD_FAILURE() << "resumed with " << key << " = " << value;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(Trainer, CheckpointFromAnotherShapeIsRejected) {
  expect_resume_refused("shape", "model.d_model", "64", "checkpoint is for model");
}

TEST(Trainer, CheckpointOfAnotherPrecisionIsRejected) {
  expect_resume_refused("precision", "precision.policy", "bf16",
                        "trained with precision 'fp32', this run uses 'bf16'");
}

TEST(Trainer, TruncatedCheckpointIsAnErrorAndNothingIsOverwritten) {
  std::string d = test_dir("trunc");
  Config c = tiny_config(d, 2);
  Trainer(c).run();
  std::string root = d + "/run/checkpoints";
  std::string step_dir = root + "/step_00000002";
  std::string model = step_dir + "/model.safetensors";
  ASSERT_TRUE(file_exists(model));
  std::filesystem::resize_file(model, std::filesystem::file_size(model) / 2);
  auto size_before = std::filesystem::file_size(model);
  c.set("train.steps", "4", "test");
  EXPECT_THROW(Trainer t(c), Error);
  EXPECT_EQ(std::filesystem::file_size(model), size_before);
  std::filesystem::remove(model);
  EXPECT_THROW(Trainer t(c), Error);
}

TEST(Trainer, KeepsLastNCheckpoints) {
  std::string d = test_dir("keep");
  Config c = tiny_config(d, 5);
  c.set("train.checkpoint_interval", "1", "test");
  Trainer(c).run();
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(d + "/run/checkpoints")) n += e.is_directory();
  EXPECT_EQ(n, 2);  // keep_last = 2
}

TEST(Trainer, MoeModelTrainsAndLogsAuxLoss) {
  std::string d = test_dir("moe");
  Config c = tiny_config(d, 6);
  c.set("model.preset", "\"tiny-moe\"", "test");
  c.set("model.n_experts", "4", "test");
  c.set("model.aux_loss_coeff", "0.05", "test");
  Trainer t(c);
  double first = 0, last = 0;
  for (int i = 0; i < 6; ++i) {
    StepResult r = t.train_step();
    // The aux loss is part of the loss: at least coeff per MoE layer (2 layers), finite.
    EXPECT_GE(r.aux_loss, 2 * 0.05 * (1 - 1e-6));
    EXPECT_LT(r.aux_loss, r.loss);
    if (i == 0) first = r.loss;
    last = r.loss;
  }
  EXPECT_LT(last, first);
  std::string d2 = test_dir("moe_run");
  Config c2 = tiny_config(d2, 2);
  c2.set("model.preset", "\"tiny-llama-moe\"", "test");
  c2.set("model.n_experts", "4", "test");
  Trainer t2(c2);
  t2.run();  // writes metrics with aux_loss and a checkpoint
  std::string metrics = read_file(d2 + "/run/metrics.jsonl");
  EXPECT_NE(metrics.find("\"aux_loss\""), std::string::npos);
}

// After a crash and a resume, metrics.jsonl holds each step once: the rows written after the
// restored step are dropped before the run continues.
TEST(Trainer, MetricsHoldEachStepOnceAfterAResume) {
  std::string d = test_dir("metrics_resume");
  Config c = tiny_config(d, 6);
  c.set("train.checkpoint_interval", "3", "test");
  {
    Trainer t(c);  // 5 steps logged, the checkpoint at 3, then a "crash"
    for (int i = 0; i < 5; ++i) {
      auto r = t.train_step();
      (void)r;
      if (t.step() == 3) t.save_checkpoint();
    }
  }
  {
    // The run as run() logs it: rows for steps 1..5 exist now (log_step is inside run()), so
    // write them the way a crashed run leaves them, a cut line included.
    std::ofstream f(d + "/run/metrics.jsonl", std::ios::app);
    for (int s = 1; s <= 5; ++s) f << "{\"step\": " << s << ", \"loss\": 1.0}\n";
    f << "{\"step\": 6, \"lo";
  }
  Trainer resumed(c);
  EXPECT_EQ(resumed.step(), 3);
  resumed.run();
  std::ifstream in(d + "/run/metrics.jsonl");
  std::map<int64_t, int> rows;
  for (std::string line; std::getline(in, line);) {
    Json j = Json::parse(line);
    if (!j.contains("valid_loss")) ++rows[j.at("step").as_int()];
  }
  for (int s = 1; s <= 6; ++s) EXPECT_EQ(rows[s], 1) << "step " << s;
}

// A diverging run stops with an error after train.max_bad_steps skipped steps, and never writes
// a checkpoint of non-finite weights: the good one stays the newest.
TEST(Trainer, DivergedRunStopsAndKeepsTheLastGoodCheckpoint) {
  std::string d = test_dir("diverge");
  Config c = tiny_config(d, 40);
  c.set("train.checkpoint_interval", "2", "test");
  c.set("train.max_bad_steps", "3", "test");
  c.set("optim.lr", "1e30", "test");
  c.set("optim.warmup_steps", "0", "test");
  c.set("train.clip_grad", "0", "test");
  {
    Trainer t(c);
    EXPECT_THROW(t.run(), Error);
  }
  auto latest = ckpt::find_latest_checkpoint(d + "/run/checkpoints");
  if (latest) {  // whatever was written holds finite weights and resumes
    ckpt::Checkpoint ck(*latest);
    Config again = tiny_config(d, 40);
    again.set("train.checkpoint_interval", "2", "test");
    Trainer t(again);
    EXPECT_GT(t.step(), 0);
  }
}

// A checkpoint with a NaN weight is refused on load, naming the parameter.
TEST(Trainer, NonFiniteWeightsInACheckpointAreAnError) {
  std::string d = test_dir("nan_ckpt");
  Config c = tiny_config(d, 2);
  {
    Trainer t(c);
    t.train_step();
    t.save_checkpoint();  // a good one, whose state the bad one copies
    ckpt::TrainerState st = ckpt::Checkpoint(d + "/run/checkpoints").state();
    t.model().params().data()[5] = NAN;
    EXPECT_THROW(t.save_checkpoint(), Error);  // never written by the trainer
    // Written behind the trainer's back: resume must refuse it.
    st.step = 2;
    ckpt::save_checkpoint(d + "/run/checkpoints", st, t.model().params().tensors(),
                          ckpt::TensorMap{});
  }
  try {
    Trainer t(c);
    ADD_FAILURE() << "a checkpoint with NaN weights was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
  }
}

// The 2-byte weights in the trainer: under bf16 with the bf16 GEMMs, the linear weights and the
// tied embedding keep no fp32 values (the resident parameter memory is lower by their 4 bytes
// per element, up to the pages they share with kept neighbours), and a checkpoint still saves
// every weight as the master rounded to bf16, which the run's own values are.
TEST(Trainer, Bf16WeightsKeepNoFp32ValuesAndSaveTheMasterRounded) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16";
  std::string d = test_dir("bf16_2byte");
  Config c = tiny_config(d, 3);
  c.set("model.d_model", "64", "test");
  c.set("precision.policy", "\"bf16\"", "test");
  Trainer t(c);
  t.run();
  t.save_checkpoint();
  const ParamSet& P = t.model().params();
  int64_t dropped = 0, runs = 0;
  for (const ParamInfo& p : P.infos())
    if (p.fp32_dropped) dropped += p.numel, ++runs;
  EXPECT_TRUE(P.info("embed.wte").fp32_dropped);
  EXPECT_TRUE(P.info("blocks.0.mlp.fc.weight").fp32_dropped);
  EXPECT_FALSE(P.info("blocks.0.mlp.fc.bias").fp32_dropped);
  const int64_t page = sysconf(_SC_PAGESIZE);
  ASSERT_GT(4 * dropped, 4 * page * runs);  // so that the bound below can fail
  const parallel::MemoryUse u = t.data_parallel()->memory_use();
  // The kept fp32 values and the whole bf16 copy, plus the pages shared at the edges.
  EXPECT_LE(u.params, 4 * (P.total() - dropped) + 2 * P.total() + page * (2 * runs + 2));
  const ckpt::Checkpoint saved(d + "/run/checkpoints");
  const std::vector<float> v = params_of(t);
  for (const ParamInfo& p : P.infos()) {
    const Tensor w = saved.model().load(p.name), m = saved.optim().load("master." + p.name);
    ASSERT_EQ(w.numel(), p.numel);
    for (int64_t i = 0; i < p.numel; ++i) {
      ASSERT_EQ(w.data<float>()[i], round_bf16(m.data<float>()[i])) << p.name << " " << i;
      ASSERT_EQ(w.data<float>()[i], v[size_t(p.offset + i)]) << p.name << " " << i;
    }
  }
}
