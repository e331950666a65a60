// DPO: the loss functions against their definitions, the trainer's DPO loss against a float64
// forward of policy and reference, its gradient against finite differences, and a run that
// raises the held-out reward accuracy.
#include <gtest/gtest.h>

#include <cstdio>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/rng.h"
#include "data/bpe.h"
#include "model/reference_decoder.h"
#include "temp_dir.h"
#include "train/dpo.h"
#include "train/dpo_recipe.h"
#include "train/preference_pairs.h"
#include "train/preference_source.h"
#include "train/trainer.h"

using namespace loom;

TEST(Dpo, LossesAndGradientsMatchTheirDefinitions) {
  DpoOptions o;
  o.beta = 0.3;
  for (DpoLoss type :
       {DpoLoss::Sigmoid, DpoLoss::Ipo, DpoLoss::Hinge, DpoLoss::Simpo, DpoLoss::Orpo}) {
    o.loss = type;
    const int64_t nc = 3, nr = 5;
    auto loss = [&](double pc, double pr) {
      const double h = (pc - -3.0) - (pr - -2.5);
      if (type == DpoLoss::Sigmoid) return -std::log(1 / (1 + std::exp(-o.beta * h)));
      if (type == DpoLoss::Ipo)
        return std::pow((pc + 3.0) / nc - (pr + 2.5) / nr - 1 / (2 * o.beta), 2);
      if (type == DpoLoss::Simpo)
        return -std::log(1 /
                         (1 + std::exp(-o.beta * (pc / nc - pr / nr - o.simpo_gamma / o.beta))));
      if (type == DpoLoss::Orpo) {
        const double ac = pc / nc, ar = pr / nr;
        const double lo = (ac - std::log(1 - std::exp(ac))) - (ar - std::log(1 - std::exp(ar)));
        return -o.beta * std::log(1 / (1 + std::exp(-lo)));
      }
      return std::max(0.0, 1 - o.beta * h);
    };
    for (double pc : {-4.0, -2.0, -0.5}) {
      PairLogps x{pc, -2.7, -3.0, -2.5, nc, nr};
      const DpoPair p = dpo_pair(x, o);
      EXPECT_NEAR(p.loss, loss(pc, x.pi_r), 1e-12) << dpo_loss_name(type);
      const double e = 1e-6;
      EXPECT_NEAR(p.d_chosen, (loss(pc + e, x.pi_r) - loss(pc - e, x.pi_r)) / (2 * e), 1e-6)
          << dpo_loss_name(type);
      EXPECT_NEAR(p.d_rejected, (loss(pc, x.pi_r + e) - loss(pc, x.pi_r - e)) / (2 * e), 1e-6)
          << dpo_loss_name(type);
    }
  }
  for (bool good : {true, false}) {
    o.loss = DpoLoss::Kto;
    auto loss = [&](double pi) { return kto_term(pi, -3.0, 0.2, good, o).loss; };
    const double e = 1e-6;
    EXPECT_NEAR(kto_term(-2.0, -3.0, 0.2, good, o).d_pi,
                (loss(-2.0 + e) - loss(-2.0 - e)) / (2 * e), 1e-9);
  }
  EXPECT_THROW(dpo_loss_from_name("chess"), Error);
}

namespace {

bool have_torch() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

#define SKIP_WITHOUT_TORCH()                                                             \
  if (!have_torch())                                                                     \
  GTEST_SKIP() << "/usr/bin/python3 cannot import torch (Debian's python3-torch, which " \
                  "scripts/setup.sh installs): the torch reference is not run"

struct TorchResult {
  double loss = 0, rewards_chosen = 0, rewards_rejected = 0;
  std::vector<std::vector<double>> grad;  // per row and reply token
};

// One case for preference_reference.py: per-token log-probs of each row (policy; reference
// unless empty).
Json torch_case(const DpoOptions& o, const std::vector<std::vector<double>>& pi,
                const std::vector<std::vector<double>>& ref, const std::vector<int8_t>& labels) {
  Json in = Json::object();
  in["loss"] = dpo_loss_name(o.loss);
  in["beta"] = o.beta;
  in["simpo_gamma"] = o.simpo_gamma;
  in["cpo_alpha"] = o.cpo_alpha;
  in["desirable_weight"] = o.desirable_weight;
  in["undesirable_weight"] = o.undesirable_weight;
  auto rows = [](const std::vector<std::vector<double>>& v) {
    Json a = Json::array();
    for (const auto& r : v) {
      Json x = Json::array();
      for (double d : r) x.push_back(d);
      a.push_back(std::move(x));
    }
    return a;
  };
  in["pi"] = rows(pi);
  in["ref"] = ref.empty() ? Json() : rows(ref);
  Json l = Json::array();
  for (int8_t b : labels) l.push_back(Json(b != 0));
  in["labels"] = std::move(l);
  return in;
}

// preference_reference.py over several cases (one torch start-up).
std::vector<TorchResult> torch_reference(const std::string& dir, const std::vector<Json>& cases) {
  Json in = Json::array();
  for (const Json& c : cases) in.push_back(c);
  write_file_atomic(dir + "/in.json", in.dump());
  const std::string cmd =
      "/usr/bin/python3 " LOOM_PREFERENCE_REFERENCE " " + dir + "/in.json " + dir + "/out.json";
  std::vector<TorchResult> results;
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << cmd;
    return std::vector<TorchResult>(cases.size());
  }
  const Json all = Json::parse(read_file(dir + "/out.json"));
  for (const Json& out : all.as_array()) {
    TorchResult r;
    r.loss = out.at("loss").as_double();
    r.rewards_chosen = out.at("rewards_chosen").as_double();
    r.rewards_rejected = out.at("rewards_rejected").as_double();
    for (const Json& row : out.at("grad").as_array()) {
      r.grad.emplace_back();
      for (const Json& g : row.as_array()) r.grad.back().push_back(g.as_double());
    }
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace

// Every loss of a micro-batch (sequence_terms: its pair terms, SimPO's and ORPO's NLL, KTO's
// KL estimate) against torch's float64 recomputation from per-token log-probs of rows of
// several lengths: the loss, and each token's gradient, which must be minus the sequence's loss
// weight. Rewards as TRL logs them.
TEST(Dpo, EveryLossMatchesTorch) {
  SKIP_WITHOUT_TORCH();
  const std::string d = loom::test::scoped_dir("dpo_torch");
  const int B = 4;
  std::vector<std::vector<double>> pi(2 * B), ref(2 * B);
  for (int q = 0; q < 2 * B; ++q)
    for (int t = 0; t < 2 + (q * 3) % 5; ++t) {
      // Six decimals: JSON's %.9g carries them exactly to torch.
      pi[size_t(q)].push_back(-0.2 -
                              std::round(2e6 * uniform_at(7, uint64_t(q), uint64_t(t))) / 1e6);
      ref[size_t(q)].push_back(-0.2 -
                               std::round(2e6 * uniform_at(8, uint64_t(q), uint64_t(t))) / 1e6);
    }
  const std::vector<int8_t> labels = {1, 0, 0, 1};
  const std::vector<DpoLoss> types = {DpoLoss::Sigmoid, DpoLoss::Hinge, DpoLoss::Ipo,
                                      DpoLoss::Simpo,   DpoLoss::Orpo,  DpoLoss::Kto};
  std::vector<Json> cases;
  std::vector<DpoRecipe::Stats> stats;
  std::vector<std::vector<double>> weights;
  for (DpoLoss type : types) {
    DpoOptions o;
    o.loss = type;
    o.beta = type == DpoLoss::Hinge ? 0.3 : 0.7;
    o.cpo_alpha = 0.5;
    o.desirable_weight = 1.5;
    const bool with_ref = uses_reference(type);
    std::vector<double> ps, rs;
    std::vector<int64_t> n;
    for (int q = 0; q < 2 * B; ++q) {
      double a = 0, b = 0;
      for (size_t t = 0; t < pi[size_t(q)].size(); ++t)
        a += pi[size_t(q)][t], b += ref[size_t(q)][t];
      ps.push_back(a);
      rs.push_back(b);
      n.push_back(int64_t(pi[size_t(q)].size()));
    }
    if (!with_ref) rs.clear();
    std::vector<double> w;
    stats.push_back(DpoRecipe::sequence_terms(o, ps, rs, n, labels, B, &w));
    weights.push_back(w);
    cases.push_back(torch_case(o, pi, with_ref ? ref : std::vector<std::vector<double>>{}, labels));
  }
  // (Torch's figures come back as JSON text of 9 significant digits: hence 1e-8.)
  const std::vector<TorchResult> all = torch_reference(d, cases);
  ASSERT_EQ(all.size(), types.size());
  for (size_t c = 0; c < types.size(); ++c) {
    const TorchResult& tr = all[c];
    const DpoRecipe::Stats& st = stats[c];
    const char* name = dpo_loss_name(types[c]);
    EXPECT_NEAR(st.loss / B, tr.loss, 1e-8 * (1 + std::fabs(tr.loss))) << name;
    ASSERT_EQ(tr.grad.size(), size_t(2 * B)) << name;
    for (int q = 0; q < 2 * B; ++q)
      for (double g : tr.grad[size_t(q)])
        EXPECT_NEAR(-g, weights[c][size_t(q)], 1e-8) << name << " row " << q;
    const auto rep = st.report(types[c], "");
    EXPECT_NEAR(rep[0].second, tr.rewards_chosen, 1e-8) << name;
    EXPECT_NEAR(rep[1].second, tr.rewards_rejected, 1e-8) << name;
  }
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
  const auto st = t.dpo()->micro(b, true, 2);
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
      const double lp = t.dpo()->micro(b, false, 1).loss / 2;
      P.data()[i] = saved - eps;
      const double lm = t.dpo()->micro(b, false, 1).loss / 2;
      P.data()[i] = saved;
      const double numeric = (lp - lm) / (2 * eps);
      EXPECT_NEAR(g[size_t(i)], numeric,
                  3e-2 * std::max(std::fabs(double(g[size_t(i)])), std::fabs(numeric)) + 2e-4)
          << p.name;
      ++checked;
    }
  EXPECT_GT(checked, 20);
}

// Through the trainer, every loss but DPO's own (above): a micro-batch's loss against torch on the
// float64 forward's per-token log-probs of policy and reference, and the gradient (the token
// weights carried through the model's backward) against finite differences.
TEST(Dpo, EveryLossThroughTheTrainerAgainstTorchAndDifferences) {
  SKIP_WITHOUT_TORCH();
  for (const char* loss : {"ipo", "simpo", "orpo", "kto"}) {
    const std::string d = dir_for(std::string("through_") + loss);
    const bool kto = std::string(loss) == "kto";
    kto ? test::write_kto_examples(d, 40) : test::write_preference_pairs(d, 40);
    Config c = dpo_config(d, 1);
    c.set("dpo.loss", cat("\"", loss, "\""), "test");
    if (kto) c.set("data.path", "\"" + d + "/kto.jsonl\"", "test");
    if (std::string(loss) == "simpo") c.set("dpo.cpo_alpha", "0.5", "test");
    Trainer t(c);
    ParamSet& P = t.model().params();
    Decoder ref_model(t.model().config(), cpu_backend());
    std::copy(P.data(), P.data() + P.total(), ref_model.params().data());
    for (int64_t i = 0; i < P.total(); ++i)
      P.data()[i] += 0.05f * (uniform_at(1, 2, uint64_t(i)) - 0.5f);
    PreferenceSource src(d + (kto ? "/kto.jsonl" : "/pairs.jsonl"), "loom:" + d + "/tok", "chatml",
                         2, 48, 1, 0.0, "train", 0, 1, kto);
    Batch b;
    src.next(b);
    auto token_lp = [&](Decoder& m, int row) {
      std::vector<int32_t> ids(b.tokens.begin() + row * 48, b.tokens.begin() + (row + 1) * 48);
      const auto lp = ref::ReferenceDecoder(m).log_probs(ids);
      std::vector<double> out;
      for (int i = 0; i < 48; ++i)
        if (b.targets[size_t(row * 48 + i)] >= 0)
          out.push_back(lp[size_t(i)][size_t(b.targets[size_t(row * 48 + i)])]);
      return out;
    };
    std::vector<std::vector<double>> pi, rf;
    for (int row = 0; row < 4; ++row) {
      pi.push_back(token_lp(t.model(), row));
      rf.push_back(token_lp(ref_model, row));
    }
    DpoOptions o = dpo_options_from(c);
    const TorchResult tr = torch_reference(
        d, {torch_case(o, pi, uses_reference(o.loss) ? rf : decltype(rf){}, b.labels)})[0];
    P.zero_grad();
    const auto st = t.dpo()->micro(b, true, 2);
    EXPECT_EQ(st.pairs, 2);
    EXPECT_NEAR(st.loss / 2, tr.loss, 1e-4 * (1 + std::fabs(tr.loss))) << loss;
    const std::vector<float> g(P.grad(), P.grad() + P.total());
    const float eps = 1e-2f;
    int checked = 0;
    for (const ParamInfo& p : P.infos())
      for (int k = 0; k < 2; ++k) {
        const int64_t i = p.offset + (p.numel - 1) * k;
        const float saved = P.data()[i];
        P.data()[i] = saved + eps;
        const double lp = t.dpo()->micro(b, false, 2).loss / 2;
        P.data()[i] = saved - eps;
        const double lm = t.dpo()->micro(b, false, 2).loss / 2;
        P.data()[i] = saved;
        const double numeric = (lp - lm) / (2 * eps);
        EXPECT_NEAR(g[size_t(i)], numeric,
                    3e-2 * std::max(std::fabs(double(g[size_t(i)])), std::fabs(numeric)) + 2e-4)
            << loss << " " << p.name;
        ++checked;
      }
    EXPECT_GT(checked, 20) << loss;
  }
}

// KTO learns from unpaired examples: the held-out desirable examples' reward rises above the
// undesirable ones' (both 0 at the start, policy = reference).
TEST(Dpo, KtoSeparatesDesirableFromUndesirable) {
  const std::string d = dir_for("kto_learn");
  test::write_kto_examples(d, 200);
  Config c = dpo_config(d, 40);
  c.set("dpo.loss", "\"kto\"", "test");
  c.set("data.path", "\"" + d + "/kto.jsonl\"", "test");
  c.set("train.eval_interval", "40", "test");
  Trainer t(c);
  for (int i = 0; i < 40; ++i) t.train_step();
  t.evaluate();
  double margin = -1;
  for (const auto& [k, v] : t.last_eval_extra())
    if (k == "valid_reward_margin") margin = v;
  std::printf("KTO held-out reward margin after 40 steps: %.3f\n", margin);
  EXPECT_GT(margin, 0.5);
}

// Bad KTO and loss settings are refused naming the line or the key.
TEST(Dpo, BadKtoDataAndLossKeysAreRefused) {
  const std::string d = dir_for("kto_bad");
  test::write_kto_examples(d, 6);
  const std::string tok = "loom:" + d + "/tok";
  auto refused = [&](const std::string& text, int batch, const std::string& needle) {
    write_file_atomic(d + "/k.jsonl", text);
    try {
      PreferenceSource(d + "/k.jsonl", tok, "chatml", batch, 32, 1, 0.0, "train", 0, 1, true);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string good = read_file(d + "/kto.jsonl");
  refused(good + "{\"prompt\": \"x\", \"completion\": \"y\"}\n", 2,
          "k.jsonl:7: expected 'prompt', 'completion' and 'label'");
  refused(good + "{\"prompt\": \"x\", \"completion\": \"y\", \"label\": 1}\n", 2,
          "k.jsonl:7: 'label' must be true");
  refused(good, 1, "needs train.micro_batch >= 2");
  auto key_refused = [&](const std::string& key, const std::string& value, const std::string& loss,
                         const std::string& needle) {
    Config c = dpo_config(d, 1);
    c.set("dpo.loss", "\"" + loss + "\"", "test");
    c.set(key, value, "test");
    try {
      dpo_options_from(c);
      ADD_FAILURE() << key << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  key_refused("dpo.simpo_gamma", "1.0", "sigmoid", "dpo.simpo_gamma (test) applies to dpo.loss");
  key_refused("dpo.desirable_weight", "2.0", "orpo", "dpo.desirable_weight (test) applies");
  key_refused("dpo.cpo_alpha", "-1", "simpo", "dpo.cpo_alpha");
  key_refused("dpo.loss", "\"kpo\"", "sigmoid", "dpo.loss must be");
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
  auto extra = [&](const std::string& key) {
    for (const auto& [k, v] : t.last_eval_extra())
      if (k == key) return v;
    ADD_FAILURE() << "no " << key;
    return 0.0;
  };
  t.evaluate();
  EXPECT_EQ(extra("valid_reward_accuracy"), 0.0);
  for (int i = 0; i < 60; ++i) t.train_step();
  t.evaluate();
  std::printf("held-out reward accuracy after 60 steps: %.3f\n", extra("valid_reward_accuracy"));
  EXPECT_GT(extra("valid_reward_accuracy"), 0.8);
  EXPECT_GT(extra("valid_reward_margin"), 0.0);
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
  refused(good +
              "{\"prompt\": [{\"role\": \"robot\", \"content\": \"x\"}], \"chosen\": \"a\", "
              "\"rejected\": \"b\"}\n",
          "p.jsonl:7: 'prompt'[0]: role 'robot' is not system, user or assistant");
  refused(good + "{\"prompt\": \"x\", \"chosen\": \"a\\u00e9\", \"rejected\": \"b\xff\"}\n",
          "p.jsonl:7: 'rejected': 'content' is not valid UTF-8 (byte 1");
}
