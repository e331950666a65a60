// GRPO's policy in reduced precision on the training engine: a bf16 (and fp16, loss-scaled)
// policy tracks the fp32 one over 20 learner steps on the same groups, and its weights stay
// values of the compute type, derived from the fp32 master.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/dtype.h"
#include "rl/grpo_trainer.h"
#include "rl/rollout.h"
#include "rl_test_util.h"

using namespace loom;
using namespace loom::rl;

namespace {

struct Track {
  std::vector<double> loss, grad_norm;
  std::vector<float> delta;  // the weights' change over the run
};

// 20 learner steps on the same groups (one step old after the first: importance weights and a
// KL against the reference move too), from the same starting weights, in `policy_name`.
Track run(const std::string& policy_name, const std::vector<PromptGroup>& groups,
          const Decoder& start) {
  RlOptions o = rltest::small_options();
  o.lr = 2e-3;
  o.precision = precision_from_name(policy_name);
  o.scaler.initial = 1024;
  Decoder policy(start.config(), cpu_backend(), Recompute::None, o.precision.compute);
  policy.params().copy_values_from(start.params());
  GrpoLearner learner(policy, o);
  Track t;
  for (int64_t s = 0; s < 20; ++s) {
    RlStepStats st;
    learner.learn(groups, s, &st);
    t.loss.push_back(st.loss);
    t.grad_norm.push_back(st.grad_norm);
  }
  const ParamSet& P = policy.params();
  t.delta.resize(size_t(P.total()));
  P.read_values(0, P.total(), t.delta.data());
  for (int64_t i = 0; i < P.total(); ++i) t.delta[size_t(i)] -= start.params().data()[i];
  // The policy's weights are values of its compute type (rounded from the master).
  if (o.precision.compute != DType::F32) {
    std::vector<float> w(size_t(P.total())), r;
    P.read_values(0, P.total(), w.data());
    r = w;
    round_to(o.precision.compute, r.data(), r.size());
    EXPECT_EQ(w, r) << policy_name << ": the policy holds values that are not " << policy_name;
  }
  return t;
}

// ||a - b|| / ||b||
double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

void expect_tracks(const std::string& name, double loss_tol, double delta_tol) {
  rltest::Fixture f;
  RlOptions o = rltest::small_options();
  RolloutWorker w(f.model, f.tok, f.chat, f.env, o);
  const std::vector<PromptGroup> groups = w.generate(0, 0).groups;
  ASSERT_FALSE(groups.empty());
  const Track ref = run("fp32", groups, f.model), low = run(name, groups, f.model);
  double worst = 0;
  for (size_t s = 0; s < ref.loss.size(); ++s)
    worst = std::max(worst, std::abs(low.loss[s] - ref.loss[s]) / (1e-3 + std::abs(ref.loss[s])));
  const double d = relative_l2(low.delta, ref.delta);
  std::printf(
      "%s vs fp32 over 20 steps: loss within %.3g (relative), weight change within %.3g "
      "(relative L2); last loss %.6g vs %.6g\n",
      name.c_str(), worst, d, low.loss.back(), ref.loss.back());
  EXPECT_LT(worst, loss_tol) << name;
  EXPECT_LT(d, delta_tol) << name;
  // The run moved: a policy that never stepped would be 1 away.
  double moved = 0;
  for (float x : ref.delta) moved = std::max(moved, double(std::abs(x)));
  EXPECT_GT(moved, 1e-3);
}

}  // namespace

// bf16: loss within 1% (relative) at every one of 20 steps, and the weights' change within 5%
// (relative L2) of the fp32 run's (measured: 0.2% and 2%).
TEST(GrpoPrecision, Bf16PolicyTracksFp32Over20Steps) {
  expect_tracks("bf16", 0.01, 0.05);
}

// fp16 with dynamic loss scaling: loss within 0.2%, weight change within 2% (measured: 0.02%
// and 0.5%).
TEST(GrpoPrecision, Fp16LossScaledPolicyTracksFp32Over20Steps) {
  expect_tracks("fp16", 0.002, 0.02);
}

// A policy built in one type and a precision of another are refused, naming both.
TEST(GrpoPrecision, PolicyOfAnotherComputeTypeIsRefused) {
  rltest::Fixture f;
  RlOptions o = rltest::small_options();
  o.precision = precision_from_name("bf16");
  try {
    GrpoLearner learner(f.model, o);
    FAIL() << "an fp32 policy under precision.policy = bf16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("computes in"), std::string::npos) << e.what();
  }
}
