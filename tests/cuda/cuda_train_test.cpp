// The Trainer on the CUDA backend (train.device = "cuda"): the whole step on the GPU (Decoder,
// gradient norm and clipping, AdamW), checkpoints staged through the host. Against the CPU
// trainer: a tiny GPT-2 trained 50 steps on both follows the same loss curve (the GPU's GEMMs
// in exact fp32 here; the sums differ only in order); a run resumed from a CUDA checkpoint is
// bit-identical to the uninterrupted CUDA run; `loom train --device cuda` trains end to end.
// Skipped without a CUDA device (cuda_test_util.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/fs.h"
#include "cuda/cuda_test_util.h"
#include "cuda/cuda_train_util.h"
#include "temp_dir.h"
#include "train/device.h"
#include "train/trainer.h"

using namespace loom;

namespace {

using test::trainer_weights;
using test::write_fox_corpus;

// GPT-2 family (cuda_train_util.h's sizes).
Config config(const std::string& dir, int steps, int ckpt) {
  return test::tiny_train_config(dir, "tiny", steps, ckpt);
}

}  // namespace

// 50 steps on the GPU (exact fp32 GEMMs: test::gpu()) and on the CPU. Tolerance: the two
// differ only in summation order (cuBLAS vs OpenBLAS, the device reductions), which the
// optimizer amplifies slowly over steps: every step's loss within 1e-3 relative during the
// first 10 steps and 2e-2 relative over all 50, and both curves must have learnt (the last
// loss well below the first).
TEST(CudaTrain, LossCurveTracksTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  test::TempDir a("cudatrain_cpu"), b("cudatrain_gpu");
  Trainer cpu(config(a.str(), 50, 0));
  Trainer gpu(config(b.str(), 50, 0), nullptr, test::gpu());
  ASSERT_FALSE(gpu.model().params().host_accessible());
  std::vector<double> lc, lg;
  for (int s = 0; s < 50; ++s) {
    lc.push_back(cpu.train_step().loss);
    lg.push_back(gpu.train_step().loss);
  }
  double worst = 0;
  for (int s = 0; s < 50; ++s) {
    ASSERT_TRUE(std::isfinite(lg[size_t(s)])) << "step " << s;
    const double rel = std::abs(lg[size_t(s)] - lc[size_t(s)]) / std::abs(lc[size_t(s)]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, s < 10 ? 1e-3 : 2e-2)
        << "step " << s << ": cuda " << lg[size_t(s)] << " cpu " << lc[size_t(s)];
  }
  EXPECT_LT(lg.back(), 0.7 * lg.front()) << "the CUDA run did not learn";
  EXPECT_LT(lc.back(), 0.7 * lc.front());
  std::printf("loss: cpu %.5f -> %.5f, cuda %.5f -> %.5f, worst relative gap %.2e\n", lc.front(),
              lc.back(), lg.front(), lg.back(), worst);
  // Evaluation (forward only, on the device) of the trained weights: the same tolerance.
  const double vc = cpu.evaluate(), vg = gpu.evaluate();
  EXPECT_LT(std::abs(vg - vc) / vc, 2e-2) << "validation loss: cuda " << vg << " cpu " << vc;
}

// The bf16 policy on the GPU (bf16 activations widened on the device, bf16 tensor-core GEMMs
// and attention, fp32 master weights) against the CPU's bf16 run (oneDNN bf16 GEMMs, fp32
// attention): the same rounding points except attention's P, so looser than fp32: every step
// within 1e-2 relative over the first 10 steps, 5e-2 over all 30, and the GPU run learns.
TEST(CudaTrain, Bf16LossCurveTracksTheCpuBf16Trainer) {
  LOOM_REQUIRE_GPU();
  test::TempDir a("cudatrain_bf16_cpu"), b("cudatrain_bf16_gpu");
  Config cc = config(a.str(), 30, 0), cg = config(b.str(), 30, 0);
  cc.set("precision.policy", "\"bf16\"", "test");
  cg.set("precision.policy", "\"bf16\"", "test");
  cg.set("train.device", "\"cuda\"", "test");
  Trainer cpu(cc), gpu(cg);
  ASSERT_FALSE(gpu.model().params().host_accessible());
  double first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    const double lc = cpu.train_step().loss, lg = gpu.train_step().loss;
    ASSERT_TRUE(std::isfinite(lg)) << "step " << s;
    EXPECT_LT(std::abs(lg - lc) / lc, s < 10 ? 1e-2 : 5e-2)
        << "step " << s << ": cuda " << lg << " cpu " << lc;
    if (s == 0) first = lg;
    last = lg;
  }
  EXPECT_LT(last, 0.8 * first) << "the bf16 CUDA run did not learn";
}

// 8 steps straight against 4 + checkpoint + a new trainer resuming + 4, both on the process's
// CUDA backend as train.device = "cuda" picks it (TF32 GEMMs): the losses and the final
// weights are the same bits (the device's reductions have a fixed order).
TEST(CudaTrain, ResumeOnCudaIsBitIdentical) {
  LOOM_REQUIRE_GPU();
  test::TempDir a("cudatrain_straight"), b("cudatrain_split");
  Config c1 = config(a.str(), 8, 0), c2 = config(b.str(), 8, 4);
  c1.set("train.device", "\"cuda\"", "test");
  c2.set("train.device", "\"cuda\"", "test");
  Trainer straight(c1);
  ASSERT_FALSE(straight.model().params().host_accessible()) << "train.device = cuda ran on the CPU";
  std::vector<double> want;
  for (int s = 0; s < 8; ++s) want.push_back(straight.train_step().loss);
  std::vector<double> got;
  {
    Trainer t(c2);
    for (int s = 0; s < 4; ++s) got.push_back(t.train_step().loss);
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  Trainer resumed(c2);
  ASSERT_EQ(resumed.step(), 4);
  for (int s = 0; s < 4; ++s) got.push_back(resumed.train_step().loss);
  EXPECT_EQ(got, want);
  const auto wa = trainer_weights(straight), wb = trainer_weights(resumed);
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)))
      << "the resumed CUDA run's weights differ from the uninterrupted run's";
}

// ZeRO-1 and ZeRO-2 in one process on the GPU: the gradients reduce-scattered (a device copy
// in a group of one) into the engine's device shard (ZeRO-2: through bucket scratch added to a
// zeroed shard), AdamW on the shard, the per-rank checkpoint layout. One micro-batch per step
// (ZeRO-2 sums micro-batches in the shard, in another order than backward's accumulation), so
// each element sees the same operations as at ZeRO-0: the losses and weights are the same bits.
TEST(CudaTrain, Zero1And2OnCudaEqualZero0) {
  LOOM_REQUIRE_GPU();
  std::vector<double> want;
  std::vector<float> want_w;
  for (int zero : {0, 1, 2}) {
    SCOPED_TRACE(zero);
    test::TempDir d("cudatrain_zero");
    Config c = config(d.str(), 5, 0);
    c.set("train.device", "\"cuda\"", "test");
    c.set("parallel.zero", std::to_string(zero), "test");
    c.set("train.grad_accum", "1", "test");
    c.set("train.micro_batch", "8", "test");
    Trainer t(c);
    std::vector<double> got;
    for (int s = 0; s < 5; ++s) got.push_back(t.train_step().loss);
    t.save_checkpoint();  // per-rank parts and a global commit at ZeRO >= 1, staged
    t.finish_checkpoints();
    const auto w = trainer_weights(t);
    if (zero == 0) {
      want = got;
      want_w = w;
      continue;
    }
    EXPECT_EQ(got, want);
    ASSERT_EQ(w.size(), want_w.size());
    EXPECT_EQ(0, std::memcmp(w.data(), want_w.data(), w.size() * sizeof(float)));
  }
}

// The command line: `loom train --device cuda` trains, checkpoints and logs metrics. Needs the
// loom binary of this build (its path compiled in); skipped when it was not built.
TEST(CudaTrain, LoomTrainDeviceCudaEndToEnd) {
  LOOM_REQUIRE_GPU();
  // $LOOM_BIN: the binary carried to a GPU machine (tests/cuda/gpu_check.sh sets it).
  const char* carried = std::getenv("LOOM_BIN");
  const std::string bin = carried ? carried : LOOM_BIN;
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << bin << " not built (cmake --target loom)";
  test::TempDir d("cudatrain_cli");
  const std::string data = write_fox_corpus(d.str(), test::kFoxLines);
  const std::string cmd =
      bin + " train --device cuda --set train.steps=5 --set train.quiet=true" +
      " --set model.n_layer=2 --set train.seq_len=32 --set train.micro_batch=4" +
      " --set train.peak_gflops=100 --set data.paths='\"" + data + "\"'" +
      " --set train.out_dir='\"" + d.str() + "/run\"' > " + d.str() + "/log.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(d.str() + "/log.txt");
  EXPECT_TRUE(std::filesystem::exists(d.str() + "/run/checkpoints/latest"));
  const std::string metrics = read_file(d.str() + "/run/metrics.jsonl");
  EXPECT_NE(metrics.find("\"step\": 5"), std::string::npos) << metrics;
}
