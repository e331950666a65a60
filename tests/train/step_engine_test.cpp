// StepEngine alone: the global gradient norm, clipping, the skip of non-finite gradients and
// fp16's loss scale, against AdamW stepped by hand on the same gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "train/step_engine.h"

namespace loom {
namespace {

// eps = 1 and no weight decay: AdamW's first update, lr * g / (|g| + 1), depends on the
// gradient's scale, so a missing or wrong clip changes the weights.
AdamWConfig scale_sensitive_adam() {
  AdamWConfig a;
  a.eps = 1.0;
  a.weight_decay = 0;
  return a;
}

float pattern(int64_t i) {
  return 0.01f * float(i % 7 - 3);
}

struct Engine {
  std::unique_ptr<comm::Communicator> self = comm::make_self_communicator();
  Decoder model{model_preset("tiny"), cpu_backend()};
  std::unique_ptr<parallel::DataParallel> dp;
  std::unique_ptr<StepEngine> engine;

  Engine(double clip, bool loss_scaling = false, double initial_scale = 1.0) {
    model.params().init(7);
    dp =
        std::make_unique<parallel::DataParallel>(model, *self, parallel::DataParallelOptions{},
                                                 scale_sensitive_adam(), DType::F32, cpu_backend());
    LossScaler::Options so;
    so.initial = initial_scale;
    engine = std::make_unique<StepEngine>(*dp, *self, std::vector<double>{}, loss_scaling,
                                          LossScaler(so), clip);
  }
  // One micro-batch whose gradients are factor x pattern (and `poison` at element 0).
  void gradients(float factor, float poison = 0.f) {
    engine->accumulate(1, [&](int) {
      ParamSet& P = model.params();
      for (int64_t i = 0; i < P.total(); ++i) P.grad()[i] = factor * pattern(i);
      if (poison != 0.f) P.grad()[0] = poison;
    });
  }
};

double pattern_norm(int64_t n) {
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) sq += double(pattern(i)) * pattern(i);
  return std::sqrt(sq);
}

// The weights AdamW takes from the initial ones on pattern gradients multiplied by grad_scale.
std::vector<float> adamw_by_hand(float factor, float grad_scale) {
  Decoder m(model_preset("tiny"), cpu_backend());
  ParamSet& P = m.params();
  P.init(7);
  AdamW adam(P, scale_sensitive_adam(), DType::F32, cpu_backend());
  P.zero_grad();
  for (int64_t i = 0; i < P.total(); ++i) P.grad()[i] = factor * pattern(i);
  adam.step(0.1, grad_scale);
  return std::vector<float>(P.data(), P.data() + P.total());
}

TEST(StepEngine, ClipsToTheGlobalNormAndSteps) {
  Engine e(0.05);
  const int64_t n = e.model.params().total();
  e.gradients(1.f);
  const StepEngine::Update u = e.engine->step(0.1, 1.0, 0);
  EXPECT_FALSE(u.skipped);
  EXPECT_NEAR(u.grad_norm, pattern_norm(n), 1e-6 * pattern_norm(n));
  ASSERT_GT(u.grad_norm, 0.05);  // the step clips
  const std::vector<float> want = adamw_by_hand(1.f, float(0.05 / u.grad_norm));
  const float* got = e.model.params().data();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[size_t(i)]) << "element " << i;
}

TEST(StepEngine, BelowTheClipStepsUnscaled) {
  Engine e(1e9);
  e.gradients(1.f);
  const StepEngine::Update u = e.engine->step(0.1, 1.0, 0);
  const std::vector<float> want = adamw_by_hand(1.f, 1.f);
  const float* got = e.model.params().data();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
  EXPECT_FALSE(u.skipped);
}

TEST(StepEngine, NonFiniteGradientsSkipTheStep) {
  Engine e(1.0);
  const ParamSet& P = e.model.params();
  const std::vector<float> before(P.data(), P.data() + P.total());
  e.gradients(1.f, NAN);
  const StepEngine::Update u = e.engine->step(0.1, 1.0, 0);
  EXPECT_TRUE(u.skipped);
  EXPECT_FALSE(std::isfinite(u.grad_norm));
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(P.data()[i], before[i]) << "element " << i;
}

// fp16: gradients carry the loss scale; the norm is reported unscaled, the update unscales,
// and an overflow skips the step and backs the scale off.
TEST(StepEngine, LossScaleIsUnscaledAndBacksOffOnOverflow) {
  Engine e(1e9, true, 1024.0);
  ASSERT_EQ(e.engine->loss_scale(), 1024.0);
  const int64_t n = e.model.params().total();
  e.gradients(1024.f);
  const StepEngine::Update u = e.engine->step(0.1, e.engine->loss_scale(), 0);
  EXPECT_FALSE(u.skipped);
  EXPECT_NEAR(u.grad_norm, pattern_norm(n), 1e-6 * pattern_norm(n));
  const std::vector<float> want = adamw_by_hand(1024.f, float(1.0 / 1024.0));
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(e.model.params().data()[i], want[size_t(i)]) << "element " << i;
  e.gradients(1024.f, INFINITY);
  EXPECT_TRUE(e.engine->step(0.1, e.engine->loss_scale(), 1).skipped);
  EXPECT_EQ(e.engine->loss_scale(), 512.0);
  EXPECT_EQ(e.engine->scaler().skipped_steps(), 1);
}

}  // namespace
}  // namespace loom
