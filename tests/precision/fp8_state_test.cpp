// Delayed scaling's state across checkpoints and evaluation: a run resumed from a checkpoint
// continues bit-identically (the amax histories, scales and pending amaxes travel in state.json),
// evaluation passes between steps record no amaxes, and a checkpoint whose fp8 state does not fit
// the run is refused naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "same_bits.h"
#include "temp_dir.h"
#include "train/trainer.h"

using namespace loom;

namespace {

std::string corpus(const std::string& dir) {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "the fox " + std::to_string(i * 7 % 13) + " jumps over " + std::to_string(i) +
            (i % 3 ? " lazy dogs.\n" : " RED CATS!\n");
  const std::string path = dir + "/corpus.txt";
  write_file_atomic(path, text);
  return path;
}

// A 3-layer gpt2-style model, bf16 policy, delayed scaling with a history of 3 steps (so the
// ring buffer wraps within the test) and the hybrid format.
Config delayed_config(const std::string& dir, const std::string& run, int steps) {
  Config c = Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 3\nd_model = 64\nn_head = 2\nmax_seq = 16\n"
      "[train]\nmicro_batch = 2\nseq_len = 16\nquiet = true\npeak_gflops = 100\nthreads = 1\n"
      "grad_accum = 2\neval_interval = 1000\neval_batches = 2\n"
      "[optim]\nlr = 5e-3\nwarmup_steps = 2\n"
      "[precision]\npolicy = \"bf16\"\nfp8_recipe = \"fp8_tensorwise_delayed\"\n"
      "fp8_format = \"hybrid\"\nfp8_amax_history = 3\n",
      "test.toml");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.out_dir", dir + "/" + run, "test");
  c.set("data.paths", corpus(dir), "test");
  return c;
}

// Widened from the bf16 copy where the 2-byte weights keep no fp32 values.
std::vector<float> weights(Trainer& t) {
  const ParamSet& p = t.model().params();
  std::vector<float> w(size_t(p.total()));
  p.read_values(0, p.total(), w.data());
  return w;
}

TEST(Fp8State, DelayedScalingResumesBitIdentically) {
  const std::string d = test::scoped_dir("fp8_state_resume");
  const int N = 8;
  std::vector<float> straight;
  std::vector<double> straight_losses, resumed_losses;
  {
    Trainer t(delayed_config(d, "straight", N));
    for (int i = 0; i < N; ++i) straight_losses.push_back(t.train_step().loss);
    straight = weights(t);
  }
  {
    Trainer t(delayed_config(d, "resumed", N));
    for (int i = 0; i < N / 2; ++i) resumed_losses.push_back(t.train_step().loss);
    t.save_checkpoint();
  }
  Trainer t(delayed_config(d, "resumed", N));
  ASSERT_EQ(t.step(), N / 2);
  // The restored history: N/2 steps' amaxes are recorded, of which the last (pending when the
  // checkpoint was taken) joins at the next step; the ring holds 3.
  Fp8Linear* l = t.fp8_recipes()->get("blocks.1.mlp.fc");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->history(Fp8Linear::X).size(), 3u);
  for (int i = N / 2; i < N; ++i) resumed_losses.push_back(t.train_step().loss);
  for (int i = 0; i < N; ++i) EXPECT_EQ(straight_losses[i], resumed_losses[i]) << "step " << i;
  EXPECT_TRUE(loom::test::same_bits(straight, weights(t)))
      << "weights after " << N << " steps differ";
}

TEST(Fp8State, EvaluationRecordsNoAmax) {
  const std::string d = test::scoped_dir("fp8_state_eval");
  const int N = 5;
  Trainer plain(delayed_config(d, "plain", N)), evaluated(delayed_config(d, "evaluated", N));
  for (int i = 0; i < N; ++i) {
    plain.train_step();
    evaluated.train_step();
    EXPECT_TRUE(std::isfinite(evaluated.evaluate()));
    for (const std::string& n : plain.fp8_recipes()->names())
      for (auto k : {Fp8Linear::X, Fp8Linear::W, Fp8Linear::DY}) {
        const Fp8Linear *a = plain.fp8_recipes()->get(n), *b = evaluated.fp8_recipes()->get(n);
        ASSERT_EQ(a->pending_amax(k), b->pending_amax(k)) << n << " tensor " << k << " step " << i;
        ASSERT_EQ(a->history(k), b->history(k)) << n << " tensor " << k << " step " << i;
      }
  }
  EXPECT_TRUE(loom::test::same_bits(weights(plain), weights(evaluated)));
}

TEST(Fp8StateBadInput, HistoryLengthMismatchIsRefused) {
  const std::string d = test::scoped_dir("fp8_state_bad");
  {
    Trainer t(delayed_config(d, "run", 4));
    t.train_step();
    t.save_checkpoint();
  }
  Config c = delayed_config(d, "run", 4);
  c.set("precision.fp8_amax_history", "5", "test");
  try {
    Trainer t(c);
    FAIL() << "a checkpoint with histories of 3 resumed into fp8_amax_history = 5";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step_00000001"), std::string::npos) << m;
    EXPECT_NE(m.find("fp8_amax_history is 5"), std::string::npos) << m;
  }
}

}  // namespace
