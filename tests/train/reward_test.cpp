// Reward models (train.mode = "reward"): the Bradley-Terry terms against torch, a run that
// raises the held-out pairs' accuracy from a language model's checkpoint (its value head drawn),
// and a resumed run that continues the straight one bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/rng.h"
#include "temp_dir.h"
#include "train/preference_pairs.h"
#include "train/reward_recipe.h"
#include "train/trainer.h"

using namespace loom;

namespace {

bool have_torch() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

Config reward_config(const std::string& d, int steps, const std::string& out) {
  Config c = Config::parse(
      "[model]\npreset = \"tiny-llama\"\nn_layer = 2\nd_model = 32\nn_head = 4\nn_kv_head = 2\n"
      "d_ff = 64\nvocab = 260\nmax_seq = 48\ninit_std = 0.1\n"
      "[data]\nsource = \"preference\"\nvalid_fraction = 0.2\n"
      "[train]\nmode = \"reward\"\nmicro_batch = 4\nseq_len = 48\nquiet = true\n"
      "peak_gflops = 100\neval_batches = 4\n[optim]\nlr = 3e-3\nwarmup_steps = 2\n"
      "weight_decay = 0.0\n",
      "test.toml");
  c.set("data.path", "\"" + d + "/pairs.jsonl\"", "test");
  c.set("data.tokenizer", "\"loom:" + d + "/tok\"", "test");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.out_dir", "\"" + d + "/" + out + "\"", "test");
  return c;
}

double extra(const std::vector<std::pair<std::string, double>>& e, const std::string& key) {
  for (const auto& [k, v] : e)
    if (k == key) return v;
  ADD_FAILURE() << "no " << key;
  return 0;
}

}  // namespace

// The Bradley-Terry loss of a micro-batch's scores and its gradients against torch (float64).
TEST(Reward, BradleyTerryMatchesTorch) {
  if (!have_torch()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch: not run";
  const std::string d = test::scoped_dir("reward_torch");
  std::vector<double> r;
  // Six decimals, which JSON's %.9g carries to torch exactly; torch's figures come back with 9
  // significant digits (hence 1e-8).
  for (int i = 0; i < 10; ++i)
    r.push_back(std::round(4e6 * (uniform_at(3, 1, uint64_t(i)) - 0.5)) / 1e6);
  std::vector<float> g;
  const RewardRecipe::Stats st = RewardRecipe::pair_terms(r, 5, &g);
  Json in = Json::object();
  in["loss"] = "reward";
  Json s = Json::array();
  for (double x : r) s.push_back(x);
  in["scores"] = std::move(s);
  write_file_atomic(d + "/in.json", in.dump());
  const std::string cmd =
      "/usr/bin/python3 " LOOM_PREFERENCE_REFERENCE " " + d + "/in.json " + d + "/out.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const Json out = Json::parse(read_file(d + "/out.json"));
  EXPECT_NEAR(st.loss / 5, out.at("loss").as_double(), 1e-8);
  for (size_t i = 0; i < r.size(); ++i)
    EXPECT_NEAR(g[i], out.at("grad").as_array()[i].as_double(), 1e-7) << i;
  EXPECT_NEAR(st.correct / 5, out.at("accuracy").as_double(), 1e-8);
}

// From a language model's checkpoint (train.pretrained: no score.weight, drawn instead), the
// held-out pairs' accuracy rises above 0.8; the checkpoint holds the head and scores with it.
TEST(Reward, TrainingRaisesHeldOutAccuracyFromALanguageModel) {
  const std::string d = test::scoped_dir("reward_learn");
  test::write_preference_pairs(d, 200);
  {
    Config lm = reward_config(d, 1, "lm");
    lm.set("train.mode", "\"sft\"", "test");
    lm.set("data.source", "\"chat\"", "test");
    write_file_atomic(d + "/chat.jsonl",
                      "{\"prompt\": \"rev abcd\", \"completion\": \"dcba\"}\n"
                      "{\"prompt\": \"rev bbaa\", \"completion\": \"aabb\"}\n");
    lm.set("data.path", "\"" + d + "/chat.jsonl\"", "test");
    lm.set("data.valid_fraction", "0.0", "test");
    Trainer t(lm);
    t.run();
  }
  Config c = reward_config(d, 40, "rm");
  c.set("train.pretrained", "\"" + d + "/lm/checkpoints\"", "test");
  c.set("train.eval_interval", "40", "test");
  Trainer t(c);
  ASSERT_TRUE(t.model().params().has("score.weight"));
  t.evaluate();
  const double before = extra(t.last_eval_extra(), "valid_reward_accuracy");
  for (int i = 0; i < 40; ++i) t.train_step();
  t.evaluate();
  const double after = extra(t.last_eval_extra(), "valid_reward_accuracy");
  std::printf("held-out pair accuracy %.3f -> %.3f after 40 steps\n", before, after);
  EXPECT_GT(after, 0.8);
  t.save_checkpoint();
  ckpt::Checkpoint saved(d + "/rm/checkpoints");
  EXPECT_TRUE(saved.model().contains("score.weight"));
}

// A resumed reward run continues the straight run's losses bit for bit.
TEST(Reward, ResumeIsBitIdentical) {
  const std::string d = test::scoped_dir("reward_resume");
  test::write_preference_pairs(d, 40);
  std::vector<double> straight;
  {
    Trainer t(reward_config(d, 6, "straight"));
    for (int i = 0; i < 6; ++i) straight.push_back(t.train_step().loss);
  }
  EXPECT_NEAR(straight[0], std::log(2.0), 0.2);  // a fresh head scores near 0
  {
    Trainer t(reward_config(d, 6, "split"));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t.train_step().loss, straight[size_t(i)]);
    t.save_checkpoint();
  }
  Trainer t(reward_config(d, 6, "split"));
  ASSERT_EQ(t.step(), 3);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(t.train_step().loss, straight[size_t(i)]) << i;
}

// Layouts and data a reward model cannot take are refused by name.
TEST(Reward, ImpossibleSettingsAreRefused) {
  const std::string d = test::scoped_dir("reward_bad");
  test::write_preference_pairs(d, 20);
  auto refused = [&](const std::string& key, const std::string& value, const std::string& needle) {
    Config c = reward_config(d, 1, "bad");
    c.set(key, value, "test");
    try {
      Trainer t(c);
      ADD_FAILURE() << key << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused("data.source", "\"chat\"", "train.mode = \"reward\" needs data.source = \"preference\"");
  refused("model.value_head", "false", "needs model.value_head");
  refused("lora.rank", "4", "LoRA");
}
