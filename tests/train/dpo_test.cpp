// DPO: the loss functions against their definitions, the trainer's DPO loss against a float64
// forward of policy and reference, its gradient against finite differences, and a run that
// raises the held-out reward accuracy.
#include <gtest/gtest.h>

#include <cstdio>

#include <cmath>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "data/bpe.h"
#include "model/reference_decoder.h"
#include "temp_dir.h"
#include "train/dpo.h"
#include "train/preference_pairs.h"
#include "train/preference_source.h"
#include "train/trainer.h"

using namespace loom;

TEST(Dpo, LossesAndGradientsMatchTheirDefinitions) {
  const double beta = 0.3;
  for (DpoLoss type : {DpoLoss::Sigmoid, DpoLoss::Ipo, DpoLoss::Hinge}) {
    auto loss = [&](double pc, double pr) {
      const double h = (pc - -3.0) - (pr - -2.5);
      if (type == DpoLoss::Sigmoid) return -std::log(1 / (1 + std::exp(-beta * h)));
      if (type == DpoLoss::Ipo) return std::pow(h - 1 / (2 * beta), 2);
      return std::max(0.0, 1 - beta * h);
    };
    for (double pc : {-4.0, -2.0, 3.0}) {
      const double pr = -2.7;
      const DpoPair p = dpo_pair(pc, pr, -3.0, -2.5, beta, type);
      EXPECT_NEAR(p.loss, loss(pc, pr), 1e-12) << dpo_loss_name(type);
      const double e = 1e-6;
      EXPECT_NEAR(p.d_chosen, (loss(pc + e, pr) - loss(pc - e, pr)) / (2 * e), 1e-6);
      EXPECT_NEAR(p.d_rejected, (loss(pc, pr + e) - loss(pc, pr - e)) / (2 * e), 1e-6);
      EXPECT_NEAR(p.reward_chosen, beta * (pc + 3.0), 1e-12);
    }
  }
  EXPECT_THROW(dpo_loss_from_name("kto"), Error);
}

namespace {

// A fresh directory removed when the test ends, pass or fail.
std::string dir_for(const std::string& name) {
  return loom::test::scoped_dir("dpo_" + name);
}

Config dpo_config(const std::string& d, int steps) {
  Config c = Config::parse(
      "[model]\npreset = \"tiny-llama\"\nn_layer = 2\nd_model = 32\nn_head = 4\nn_kv_head = 2\n"
      "d_ff = 64\nvocab = 260\nmax_seq = 48\ninit_std = 0.1\n"
      "[data]\nsource = \"preference\"\nvalid_fraction = 0.2\n"
      "[train]\nmode = \"dpo\"\nmicro_batch = 4\nseq_len = 48\nquiet = true\npeak_gflops = 100\n"
      "eval_batches = 4\n[optim]\nlr = 3e-3\nwarmup_steps = 2\nweight_decay = 0.0\n"
      "[dpo]\nbeta = 0.5\n",
      "test.toml");
  c.set("data.path", "\"" + d + "/pairs.jsonl\"", "test");
  c.set("data.tokenizer", "\"loom:" + d + "/tok\"", "test");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.out_dir", "\"" + d + "/run\"", "test");
  return c;
}

}  // namespace

// The DPO loss of a batch equals the float64 forward's, and its gradient finite differences.
TEST(Dpo, TrainerLossAndGradientAgainstReferences) {
  const std::string d = dir_for("grad");
  test::write_preference_pairs(d, 40);
  Trainer t(dpo_config(d, 1));
  ParamSet& P = t.model().params();
  // A reference copy (the starting weights), then a policy that differs from it.
  Decoder ref_model(t.model().config(), cpu_backend());
  std::copy(P.data(), P.data() + P.total(), ref_model.params().data());
  for (int64_t i = 0; i < P.total(); ++i)
    P.data()[i] += 0.05f * (uniform_at(1, 2, uint64_t(i)) - 0.5f);
  PreferenceSource src(d + "/pairs.jsonl", "loom:" + d + "/tok", "chatml", 2, 48, 1, 0.0, "train");
  Batch b;
  src.next(b);
  // float64: sequence log-probabilities of each row, policy and reference.
  auto seq_lp = [&](Decoder& m, int row) {
    std::vector<int32_t> ids(b.tokens.begin() + row * 48, b.tokens.begin() + (row + 1) * 48);
    const auto lp = ref::ReferenceDecoder(m).log_probs(ids);
    double s = 0;
    for (int i = 0; i < 48; ++i)
      if (b.targets[size_t(row * 48 + i)] >= 0)
        s += lp[size_t(i)][size_t(b.targets[size_t(row * 48 + i)])];
    return s;
  };
  double want = 0;
  for (int k = 0; k < 2; ++k) {
    const double h = (seq_lp(t.model(), 2 * k) - seq_lp(ref_model, 2 * k)) -
                     (seq_lp(t.model(), 2 * k + 1) - seq_lp(ref_model, 2 * k + 1));
    want += std::log1p(std::exp(-0.5 * h));
  }
  P.zero_grad();
  const auto st = t.dpo_micro(b, true, 2);
  EXPECT_EQ(st.pairs, 2);
  EXPECT_NEAR(st.loss, want, 1e-4);
  const std::vector<float> g(P.grad(), P.grad() + P.total());
  const float eps = 1e-2f;
  int checked = 0;
  for (const ParamInfo& p : P.infos())
    for (int k = 0; k < 2; ++k) {
      const int64_t i = p.offset + (p.numel - 1) * k;
      const float saved = P.data()[i];
      P.data()[i] = saved + eps;
      const double lp = t.dpo_micro(b, false, 1).loss / 2;
      P.data()[i] = saved - eps;
      const double lm = t.dpo_micro(b, false, 1).loss / 2;
      P.data()[i] = saved;
      const double numeric = (lp - lm) / (2 * eps);
      EXPECT_NEAR(g[size_t(i)], numeric,
                  3e-2 * std::max(std::fabs(double(g[size_t(i)])), std::fabs(numeric)) + 2e-4)
          << p.name;
      ++checked;
    }
  EXPECT_GT(checked, 20);
}

// Learning: DPO raises the held-out pairs' reward accuracy (0 at the start, when policy and
// reference agree and no reward is larger) above 0.8, as the issue asks (measured: 1.0 after 60
// steps).
TEST(Dpo, TrainingRaisesHeldOutRewardAccuracy) {
  const std::string d = dir_for("learn");
  test::write_preference_pairs(d, 200);
  Config c = dpo_config(d, 60);
  c.set("train.eval_interval", "60", "test");
  Trainer t(c);
  t.evaluate();
  EXPECT_EQ(t.last_eval_extra()[0].second, 0.0);
  for (int i = 0; i < 60; ++i) t.train_step();
  t.evaluate();
  std::printf("held-out reward accuracy after 60 steps: %.3f\n", t.last_eval_extra()[0].second);
  EXPECT_GT(t.last_eval_extra()[0].second, 0.8);  // valid_reward_accuracy
  EXPECT_GT(t.last_eval_extra()[1].second, 0.0);  // valid_reward_margin
}

// The reference is the run's starting weights whatever way the run comes back: a resumed run
// continues the straight run's losses bit for bit (its reference is not the weights it resumed
// with), and a run started from a weights-only checkpoint (train.init_from, as from `loom ckpt
// import`) takes them as its reference too (policy = reference: the first loss is log 2).
TEST(Dpo, ReferenceIsTheStartingWeightsAfterResumeAndInitFrom) {
  const std::string d = dir_for("resume");
  test::write_preference_pairs(d, 40);
  auto config = [&](const std::string& out) {
    Config c = dpo_config(d, 6);
    c.set("train.out_dir", "\"" + d + "/" + out + "\"", "test");
    return c;
  };
  std::vector<double> straight;
  {
    Trainer t(config("straight"));
    for (int i = 0; i < 6; ++i) straight.push_back(t.train_step().loss);
  }
  EXPECT_NEAR(straight[0], std::log(2.0), 1e-6);
  {
    Trainer t(config("split"));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t.train_step().loss, straight[size_t(i)]);
    t.save_checkpoint();
  }
  {
    Trainer t(config("split"));
    ASSERT_EQ(t.step(), 3);
    for (int i = 3; i < 6; ++i) EXPECT_EQ(t.train_step().loss, straight[size_t(i)]) << i;
  }
  // Weights only: the straight run's final weights as a weights-only checkpoint.
  {
    Config c = config("base");
    c.set("train.steps", "2", "test");
    Trainer base(c);
    base.run();
  }
  const std::string weights = d + "/weights";
  {
    ckpt::Checkpoint c(d + "/base/checkpoints");
    ckpt::TrainerState st;
    st.config_text = c.state().config_text;
    ckpt::save_checkpoint(weights, st, c.model().load_all(), ckpt::TensorMap{});
  }
  auto from = [&](const std::string& out) {
    Config c = config(out);
    c.set("train.init_from", "\"" + weights + "\"", "test");
    return c;
  };
  std::vector<double> from_straight;
  {
    Trainer t(from("from"));
    EXPECT_EQ(t.step(), 0);
    for (int i = 0; i < 4; ++i) from_straight.push_back(t.train_step().loss);
  }
  EXPECT_NEAR(from_straight[0], std::log(2.0), 1e-6);
  {
    Trainer t(from("from_split"));
    for (int i = 0; i < 2; ++i) t.train_step();
    t.save_checkpoint();
  }
  // Resumed, the run's reference is init_from's weights again, not its own resumed weights.
  Trainer t(from("from_split"));
  ASSERT_EQ(t.step(), 2);
  for (int i = 2; i < 4; ++i) EXPECT_EQ(t.train_step().loss, from_straight[size_t(i)]) << i;
}

// Preference data that teaches nothing or is not chat data: a pair with chosen == rejected and a
// prompt that pushes a whole reply past train.seq_len are warned with their count and first
// line; every pair identical is refused; an unknown role and content that is not UTF-8 are
// refused naming the line, as chat data is.
TEST(Dpo, PreferenceDataThatTeachesNothingIsWarnedOrRefused) {
  const std::string d = dir_for("pref_bad");
  test::write_preference_pairs(d, 6);
  const std::string tok = "loom:" + d + "/tok";
  auto source = [&](const std::string& text) {
    write_file_atomic(d + "/p.jsonl", text);
    return PreferenceSource(d + "/p.jsonl", tok, "chatml", 2, 32, 1, 0.0, "train");
  };
  const std::string good = read_file(d + "/pairs.jsonl");
  const std::string same = "{\"prompt\": \"x\", \"chosen\": \"yy\", \"rejected\": \"yy\"}\n";
  const std::string long_prompt =
      "{\"prompt\": \"" + std::string(40, 'p') + "\", \"chosen\": \"a\", \"rejected\": \"b\"}\n";
  testing::internal::CaptureStderr();
  source(good + same + same + long_prompt);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("2 of 9 pairs have 'chosen' equal to 'rejected' (first " + d + "/p.jsonl:7)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("1 of 9 pairs have a prompt so long that a whole reply falls past "
                     "train.seq_len 32 (first " +
                     d + "/p.jsonl:9)"),
            std::string::npos)
      << log;
  auto refused = [&](const std::string& text, const std::string& needle) {
    try {
      source(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(same + same, "every one of the 2 pairs has 'chosen' equal to 'rejected'");
  refused(good + "{\"prompt\": [{\"role\": \"robot\", \"content\": \"x\"}], \"chosen\": \"a\", "
                 "\"rejected\": \"b\"}\n",
          "p.jsonl:7: 'prompt'[0]: role 'robot' is not system, user or assistant");
  refused(good + "{\"prompt\": \"x\", \"chosen\": \"a\\u00e9\", \"rejected\": \"b\xff\"}\n",
          "p.jsonl:7: 'rejected': 'content' is not valid UTF-8 (byte 1");
}
