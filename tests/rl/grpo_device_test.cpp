// GRPO on the training engine where the host may not touch the model's memory (the guarded
// backend, tests/kernels/guarded_backend.h: what a GPU's device memory would be), and resume:
// a synchronous run on the guarded backend equals the CPU run bit for bit (rollouts, learner,
// reference and optimizer all go through Backend ops), and a run stopped and resumed from its
// checkpoint ends with the uninterrupted run's weights, bit for bit, in fp32, bf16 and fp16
// (the checkpoint carries the fp32 master, and under fp16 the loss scaler's state).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/guarded_backend.h"
#include "rl/async_grpo.h"
#include "rl/grpo_trainer.h"
#include "rl/rl_checkpoint.h"
#include "rl_test_util.h"
#include "same_bits.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::rl;

namespace {

struct RunResult {
  std::vector<double> loss, grad_norm, kl, reward;
  std::vector<float> weights;
};

RunResult finish(Decoder& policy, RunResult r) {
  const ParamSet& P = policy.params();
  r.weights.resize(size_t(P.total()));
  P.read_values(0, P.total(), r.weights.data());
  return r;
}

void record(RunResult& r, const RlStepStats& st) {
  r.loss.push_back(st.loss);
  r.grad_norm.push_back(st.grad_norm);
  r.kl.push_back(st.kl);
  r.reward.push_back(st.reward_mean);
}

// `steps` synchronous GRPO steps of a policy on `be`, drawn from the fixture's seed.
RunResult run_on(Backend& be, int steps) {
  rltest::Fixture f;  // its tokenizer, template and environment (its model is the start)
  Decoder policy(f.model.config(), be);
  policy.params().copy_values_from(f.model.params());
  RlOptions o = rltest::small_options();
  GrpoTrainer t(policy, f.tok, f.chat, f.env, o);
  RunResult r;
  for (int s = 0; s < steps; ++s) record(r, t.step());
  return finish(policy, r);
}

// --async at max staleness 0 (deterministic): the rollout thread's snapshot is made in the
// policy's type on its backend, and the versions are published through Backend copies.
RunResult async_on(Backend& be, int steps) {
  rltest::Fixture f;
  Decoder policy(f.model.config(), be);
  policy.params().copy_values_from(f.model.params());
  RlOptions o = rltest::small_options();
  AsyncOptions ao;
  ao.max_staleness = 0;
  ao.threads_per_role = 1;
  ao.learner_timeout = 120;
  AsyncGrpo t(policy, f.tok, f.chat, f.env, o, ao);
  RunResult r;
  for (int s = 0; s < steps; ++s) record(r, t.step());
  t.stop();
  return finish(policy, r);
}

[[noreturn]] void guarded_child() {
  std::string bad;
  try {
    const RunResult want = run_on(cpu_backend(), 3);
    test::GuardedBackend g;
    const RunResult got = run_on(g, 3);
    bool trained = false;
    for (double n : want.grad_norm) trained = trained || n > 0;
    if (!trained) bad += " (the CPU run trained on nothing)";
    if (got.loss != want.loss) bad += " losses";
    if (got.grad_norm != want.grad_norm) bad += " gradient norms";
    if (got.kl != want.kl) bad += " KL";
    if (got.reward != want.reward) bad += " rewards (the rollouts)";
    if (!test::same_bits(got.weights, want.weights)) bad += " weights";
    if (g.ops() < 1000) bad += " (too few ops went through the guarded backend)";
    test::GuardedBackend ga;
    const RunResult async_want = async_on(cpu_backend(), 2), async_got = async_on(ga, 2);
    if (async_got.loss != async_want.loss || async_got.grad_norm != async_want.grad_norm)
      bad += " (--async at max staleness 0: steps)";
    if (!test::same_bits(async_got.weights, async_want.weights)) bad += " (--async: weights)";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run threw: %s\n", e.what());
    std::exit(2);
  }
  if (!bad.empty()) std::fprintf(stderr, "guarded GRPO differs:%s\n", bad.c_str());
  std::exit(bad.empty() ? 0 : 1);
}

// `steps` synchronous steps in `precision`; stopped after `stop` steps (0: never) into a
// checkpoint under `dir` and continued by a new trainer restored from it.
RunResult resumed_run(const std::string& precision, int steps, int stop, const std::string& dir) {
  rltest::Fixture f;
  RlOptions o = rltest::small_options();
  o.precision = precision_from_name(precision);
  // fp16: a scale that grows during the run, so that the resume must continue its history.
  o.scaler.initial = 1024;
  o.scaler.growth_interval = 2;
  auto make_policy = [&] {
    auto p = std::make_unique<Decoder>(f.model.config(), cpu_backend(), Recompute::None,
                                       o.precision.compute);
    p->params().copy_values_from(f.model.params());
    return p;
  };
  auto policy = make_policy();
  auto t = std::make_unique<GrpoTrainer>(*policy, f.tok, f.chat, f.env, o);
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    if (stop > 0 && s == stop) {
      RlCheckpointInfo info;
      info.fingerprint = f.model.config().fingerprint();
      info.precision = precision;
      const StepEngine& engine = t->learner().engine().engine();
      if (engine.loss_scaling()) info.loss_scaler = engine.scaler().state();
      const std::string saved =
          save_rl_checkpoint(dir, s, info, *policy, t->learner().optimizer(), {});
      t.reset();
      // A new process's start: the starting weights again (the reference copies them), then the
      // checkpoint's weights and optimizer state.
      policy = make_policy();
      RlResumePoint rp = open_rl_checkpoint(saved, f.model.config().fingerprint());
      t = std::make_unique<GrpoTrainer>(*policy, f.tok, f.chat, f.env, o, rp.restore);
      EXPECT_EQ(t->steps_taken(), s);
    }
    record(r, t->step());
  }
  return finish(*policy, r);
}

}  // namespace

TEST(GrpoDevice, GuardedBackendRunEqualsTheCpuRunBitForBit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(), ::testing::ExitedWithCode(0), "");
}

TEST(GrpoResume, Fp32Bf16AndFp16ResumesAreBitIdentical) {
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    test::TempDir dir;
    const RunResult whole = resumed_run(precision, 5, 0, dir / "a");
    const RunResult resumed = resumed_run(precision, 5, 2, dir / "b");
    EXPECT_TRUE(test::same_bits(whole.weights, resumed.weights)) << precision;
    EXPECT_EQ(whole.loss, resumed.loss) << precision;
    EXPECT_EQ(whole.grad_norm, resumed.grad_norm) << precision;
    bool trained = false;
    for (size_t s = 2; s < whole.grad_norm.size(); ++s) trained = trained || whole.grad_norm[s] > 0;
    EXPECT_TRUE(trained) << precision << ": nothing trained after the resume point";
  }
}
