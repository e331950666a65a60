// The Trainer with a mixture-of-experts model on the CUDA backend (one process): the MoE layers'
// router, top-k, routing plan, dispatch, expert GEMMs, combine and aux loss through the
// backend's MoE ops, AdamW and the norm on the device. Against the CPU trainer: a tiny GPT-2 MoE
// (8 experts, top-2, dropless) follows the CPU's loss and aux-loss curves with the GPU's GEMMs in
// exact fp32 (test::gpu()), so the router's scores differ from the CPU's only in summation order
// and pick the same experts; a Llama MoE with capacity-limited routing (dropped tokens) resumes
// from a CUDA checkpoint bit-identically. Skipped without a CUDA device (cuda_test_util.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/fs.h"
#include "cuda/cuda_test_util.h"
#include "cuda/cuda_train_util.h"
#include "temp_dir.h"
#include "train/trainer.h"

using namespace loom;

namespace {

using test::trainer_weights;

// tiny-moe (GPT-2 family) or tiny-llama-moe at cuda_train_util.h's sizes.
Config config(const std::string& dir, const std::string& preset, int steps, int ckpt) {
  return test::tiny_train_config(dir, preset, steps, ckpt);
}

}  // namespace

// 30 steps on the GPU (exact fp32 GEMMs) and on the CPU. Tolerance as the dense trainer test's
// (the two differ only in summation order, which the optimizer amplifies slowly): every step's
// loss within 1e-3 relative over the first 10 steps and 2e-2 over all 30; the aux loss (a sum
// of routing fractions times mean scores: a different expert choice for one token moves it by
// about 1/N) within 1e-3 relative over the first 10 steps; both runs learn.
TEST(CudaTrainMoe, LossAndAuxCurvesTrackTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  test::TempDir a("cudamoe_cpu"), b("cudamoe_gpu");
  Trainer cpu(config(a.str(), "tiny-moe", 30, 0));
  Trainer gpu(config(b.str(), "tiny-moe", 30, 0), nullptr, test::gpu());
  ASSERT_FALSE(gpu.model().params().host_accessible());
  ASSERT_NE(gpu.model().moe_layer(0), nullptr) << "the model has no MoE layer";
  double first = 0, last = 0, worst = 0;
  for (int s = 0; s < 30; ++s) {
    const StepResult c = cpu.train_step(), g = gpu.train_step();
    ASSERT_TRUE(std::isfinite(g.loss) && std::isfinite(g.aux_loss)) << "step " << s;
    ASSERT_GT(c.aux_loss, 0) << "step " << s << ": the CPU run reports no aux loss";
    const double rel = std::abs(g.loss - c.loss) / c.loss;
    worst = std::max(worst, rel);
    EXPECT_LT(rel, s < 10 ? 1e-3 : 2e-2)
        << "step " << s << ": cuda " << g.loss << " cpu " << c.loss;
    if (s < 10) {
      EXPECT_LT(std::abs(g.aux_loss - c.aux_loss) / c.aux_loss, 1e-3)
          << "step " << s << ": aux loss cuda " << g.aux_loss << " cpu " << c.aux_loss;
    }
    if (s == 0) first = g.loss;
    last = g.loss;
  }
  EXPECT_LT(last, 0.7 * first) << "the CUDA MoE run did not learn";
  std::printf("moe loss: cuda %.5f -> %.5f, worst relative gap to the cpu %.2e\n", first, last,
              worst);
  const double vc = cpu.evaluate(), vg = gpu.evaluate();
  EXPECT_LT(std::abs(vg - vc) / vc, 2e-2) << "validation loss: cuda " << vg << " cpu " << vc;
}

// Llama MoE with capacity_factor 1.0 (tokens dropped: the routing plan read back decides which)
// on the process's CUDA backend as train.device = "cuda" picks it: 6 steps straight against
// 3 + checkpoint + a new trainer resuming + 3. The device's MoE ops and reductions have a fixed
// order (no atomics), so losses, aux losses and final weights are the same bits.
TEST(CudaTrainMoe, CapacityLimitedLlamaMoeResumesBitIdentically) {
  LOOM_REQUIRE_GPU();
  test::TempDir a("cudamoe_straight"), b("cudamoe_split");
  Config c1 = config(a.str(), "tiny-llama-moe", 6, 0), c2 = config(b.str(), "tiny-llama-moe", 6, 3);
  for (Config* c : {&c1, &c2}) {
    c->set("train.device", "\"cuda\"", "test");
    c->set("model.capacity_factor", "1.0", "test");
  }
  Trainer straight(c1);
  ASSERT_FALSE(straight.model().params().host_accessible()) << "train.device = cuda ran on the CPU";
  std::vector<double> want, want_aux, got, got_aux;
  for (int s = 0; s < 6; ++s) {
    const StepResult r = straight.train_step();
    want.push_back(r.loss);
    want_aux.push_back(r.aux_loss);
  }
  {
    Trainer t(c2);
    for (int s = 0; s < 3; ++s) {
      const StepResult r = t.train_step();
      got.push_back(r.loss);
      got_aux.push_back(r.aux_loss);
    }
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  Trainer resumed(c2);
  ASSERT_EQ(resumed.step(), 3);
  for (int s = 0; s < 3; ++s) {
    const StepResult r = resumed.train_step();
    got.push_back(r.loss);
    got_aux.push_back(r.aux_loss);
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_aux, want_aux);
  EXPECT_GT(want_aux.front(), 0) << "no aux loss: the MoE layers did not route";
  const auto wa = trainer_weights(straight), wb = trainer_weights(resumed);
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)))
      << "the resumed CUDA MoE run's weights differ from the uninterrupted run's";
}
