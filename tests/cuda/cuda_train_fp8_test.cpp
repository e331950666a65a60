// The FP8 recipes in the Trainer on the CUDA backend (train.device = "cuda" with
// precision.fp8_recipe; precision/device_fp8.h) against the CPU trainer with the same recipe: a
// tiny GPT-2 trained 30 steps on both. Both quantise the same tensors with the same scales; the
// GEMMs differ in summation order (cuBLASLt vs oneDNN / the fp32 fallback) and the GPU's
// attention and reductions in order too. Tolerances:
//   step 1 (the same initial weights; delayed scaling has no history yet, scale 1 on both
//       sides): loss within 2e-3 relative, as CudaStep.Fp8StepMatchesCpuRecipeLoss;
//   the curve, loosely: every step within 20% and the mean of the last 5 steps within 10%.
//       fp8 training on tiny batches is chaotic (docs/gpu.md: a 1e-6 perturbation of the
//       initial weights moves the CPU's own fp8 curve by up to 20% by step 25), but a recipe that
//       scales wrongly is off by far more (bench_cuda's fp8-delayed loss once rose above ln V);
//   learning: the GPU run's last loss below 0.8 x its first.
// Also: the GPU recipe takes the layers the CPU one does (fp8_keep_last), evaluation records no
// amaxes and agrees as loosely, and on a GPU without fp8 tensor cores (below sm_89) the
// per-tensor recipes are refused by name while mxfp8 runs. Delayed scaling resumed from a GPU
// checkpoint is bit-identical to the uninterrupted GPU run (its histories travel in the
// checkpoint, in the CPU recipe's format: a CPU trainer resumes them). Skipped without a CUDA
// device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "cuda/cuda_test_util.h"
#include "cuda/cuda_train_util.h"
#include "temp_dir.h"
#include "train/trainer.h"

using namespace loom;

namespace {

// GPT-2 family at cuda_train_util.h's sizes (every linear a multiple of 16: 4 x 32 = 128 tokens
// per micro-batch), 30 steps, no checkpoints; `recipe` with hybrid format (E5M2 gradients, TE's
// default), plus `extra` [precision] keys.
Config config(const std::string& dir, const std::string& recipe, const std::string& extra) {
  Config c =
      test::tiny_train_config(dir, "tiny", 30, 0, "[precision]\nfp8_format = \"hybrid\"\n" + extra);
  c.set("precision.fp8_recipe", std::string(1, '"').append(recipe).append(1, '"'), "test");
  return c;
}

// 30 steps of `recipe` on the CPU and on the GPU (exact fp32 elsewhere: test::gpu()), compared
// as the header says.
void run_against_cpu(const std::string& recipe, const std::string& extra) {
  test::TempDir a("cudafp8_cpu"), b("cudafp8_gpu");
  Trainer cpu(config(a.str(), recipe, extra));
  Trainer gpu(config(b.str(), recipe, extra), nullptr, test::gpu());
  ASSERT_FALSE(gpu.model().params().host_accessible());
  ASSERT_NE(cpu.fp8_recipes(), nullptr);
  ASSERT_NE(gpu.device_fp8_recipes(), nullptr);
  EXPECT_EQ(gpu.fp8_recipes(), nullptr);  // not the host recipe on device memory
  const DeviceFp8Recipes& g = *gpu.device_fp8_recipes();
  const std::vector<std::string>& names = cpu.fp8_recipes()->names();
  ASSERT_EQ(g.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(g.name(i), names[i]);

  std::vector<double> lc, lg;
  for (int s = 0; s < 30; ++s) {
    lc.push_back(cpu.train_step().loss);
    lg.push_back(gpu.train_step().loss);
    ASSERT_TRUE(std::isfinite(lg.back())) << "step " << s + 1;
  }
  EXPECT_NEAR(lg[0], lc[0], 2e-3 * lc[0]) << "step 1: the same weights, the same recipe";
  for (size_t s = 1; s < lc.size(); ++s)
    EXPECT_LT(std::fabs(lg[s] - lc[s]), 0.2 * lc[s])
        << "step " << s + 1 << ": cuda " << lg[s] << " cpu " << lc[s];
  double tail_c = 0, tail_g = 0;
  for (size_t s = lc.size() - 5; s < lc.size(); ++s) tail_c += lc[s] / 5, tail_g += lg[s] / 5;
  EXPECT_LT(std::fabs(tail_g - tail_c), 0.1 * tail_c)
      << "mean of the last 5 steps: cuda " << tail_g << " cpu " << tail_c;
  EXPECT_LT(lg.back(), 0.8 * lg.front()) << "the fp8 CUDA run did not learn";
  EXPECT_LT(lc.back(), 0.8 * lc.front()) << "the fp8 CPU run did not learn";
  // Evaluation: forward only on the device, no amaxes recorded; the next step still trains.
  const double vc = cpu.evaluate(), vg = gpu.evaluate();
  EXPECT_LT(std::fabs(vg - vc), 0.1 * vc) << "validation loss: cuda " << vg << " cpu " << vc;
  EXPECT_TRUE(std::isfinite(gpu.train_step().loss));
  std::printf("%s: cpu %.4f -> %.4f, cuda %.4f -> %.4f, validation cpu %.4f cuda %.4f\n",
              recipe.c_str(), lc.front(), lc.back(), lg.front(), lg.back(), vc, vg);
}

bool fp8_tensor_cores() {
  return test::gpu()->sm_version() >= 89;
}

// Below sm_89: the per-tensor recipes are refused by name before anything is written.
void expect_refused_without_fp8_cores(const std::string& recipe) {
  test::TempDir d("cudafp8_refused");
  try {
    Trainer t(config(d.str(), recipe, ""), nullptr, test::gpu());
    ADD_FAILURE() << recipe << " was accepted on sm_" << test::gpu()->sm_version();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs fp8 tensor cores (sm_89 or newer)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(d.str() + "/run")) << "the refused run wrote its directory";
}

}  // namespace

TEST(CudaTrainFp8, TensorwiseCurrentTracksTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  if (!fp8_tensor_cores()) return expect_refused_without_fp8_cores("fp8_tensorwise_current");
  run_against_cpu("fp8_tensorwise_current", "");
}

TEST(CudaTrainFp8, TensorwiseDelayedTracksTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  if (!fp8_tensor_cores()) return expect_refused_without_fp8_cores("fp8_tensorwise_delayed");
  // A history shorter than the run, so old amaxes leave it within the 30 steps.
  run_against_cpu("fp8_tensorwise_delayed", "fp8_amax_history = 8\n");
}

// MXFP8 (emulated on bf16 GEMMs: any GPU), with the last block kept in bf16: the GPU recipe
// takes block 0's linears only, as the CPU one does.
TEST(CudaTrainFp8, Mxfp8WithAKeptBlockTracksTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  run_against_cpu("mxfp8", "fp8_keep_last = 1\n");
}

// 8 steps straight against 4 + checkpoint + a new trainer resuming + 4, on the GPU with delayed
// scaling (a history of 3, so the ring wraps before and after the checkpoint): the scales,
// histories and pending amaxes travel in the checkpoint (precision/device_fp8_scaling.h), so the
// losses and final weights are the same bits (as the CPU trainer's
// Fp8State.DelayedScalingResumesBitIdentically). The state a resumed trainer holds is the one
// saved, and a CPU trainer resuming the GPU's checkpoint holds the same (one format).
TEST(CudaTrainFp8, TensorwiseDelayedResumesBitIdentically) {
  LOOM_REQUIRE_GPU();
  if (!fp8_tensor_cores()) return expect_refused_without_fp8_cores("fp8_tensorwise_delayed");
  const std::string extra = "fp8_amax_history = 3\n";
  test::TempDir a("cudafp8_straight"), b("cudafp8_split");
  Trainer straight(config(a.str(), "fp8_tensorwise_delayed", extra), nullptr, test::gpu());
  std::vector<double> want, got;
  for (int s = 0; s < 8; ++s) want.push_back(straight.train_step().loss);
  std::string saved;
  {
    Trainer t(config(b.str(), "fp8_tensorwise_delayed", extra), nullptr, test::gpu());
    for (int s = 0; s < 4; ++s) got.push_back(t.train_step().loss);
    ASSERT_NE(t.device_fp8_recipes(), nullptr);
    saved = t.device_fp8_recipes()->state().dump();
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  ASSERT_NE(saved.find("\"pending\""), std::string::npos) << "no pending amax saved: " << saved;
  Config resume = config(b.str(), "fp8_tensorwise_delayed", extra);
  {
    Trainer cpu(resume);  // the CPU recipe on the GPU's checkpoint
    ASSERT_EQ(cpu.step(), 4);
    EXPECT_EQ(cpu.fp8_recipes()->state().dump(), saved);
  }
  Trainer resumed(resume, nullptr, test::gpu());
  ASSERT_EQ(resumed.step(), 4);
  EXPECT_EQ(resumed.device_fp8_recipes()->state().dump(), saved);
  for (int s = 0; s < 4; ++s) got.push_back(resumed.train_step().loss);
  EXPECT_EQ(got, want);
  const auto wa = test::trainer_weights(straight), wb = test::trainer_weights(resumed);
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)))
      << "the resumed fp8-delayed CUDA run's weights differ from the uninterrupted run's";
}
