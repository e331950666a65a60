// The rest of the trainer on the CUDA backend against the CPU trainer: ZeRO-3 (blocks gathered
// and released in device memory), bf16 gradient reduction (the bucket casts on the device),
// LoRA (adapters, their optimizer, the merged weights) and DPO (the frozen reference's forward
// on the device; full, ZeRO-3 and LoRA). Each case trains on the CPU, and on the GPU twice:
// straight, and split by a checkpoint and a new trainer resuming from it. The GPU's runs are
// the same bits (the device's reductions have a fixed order); against the CPU the losses stay
// within a relative tolerance (exact fp32 GEMMs, test::gpu(): the sums differ only in order;
// bf16 looser). Skipped without a CUDA device (cuda_test_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/cuda_train_util.h"
#include "model/lora.h"
#include "temp_dir.h"
#include "train/trainer.h"
#include "train/trainer_setups.h"

using namespace loom;

namespace {

using test::quoted;

struct Curve {
  std::vector<double> loss;
  std::vector<float> weights, merged;  // the model's (LoRA: the base, then merged)
  double valid = 0;
};

// `steps` steps of make(dir) on `be` (null: the CPU); split > 0: a checkpoint after `split`
// steps and a new trainer resuming from it for the rest. Then an evaluation, and under LoRA
// the merged weights.
template <typename Make>
Curve train(const std::string& dir, Make make, Backend* be, int steps, int split) {
  const Config c = make(dir);
  Curve r;
  int done = 0;
  if (split > 0) {
    Trainer t(c, nullptr, be);
    for (; done < split; ++done) r.loss.push_back(t.train_step().loss);
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  Trainer t(c, nullptr, be);
  EXPECT_EQ(t.step(), done) << "did not resume";
  if (be) {
    EXPECT_FALSE(t.model().params().host_accessible());
  }
  for (; done < steps; ++done) r.loss.push_back(t.train_step().loss);
  r.valid = t.evaluate();
  r.weights = test::trainer_weights(t);
  if (Lora* l = t.lora()) {
    l->merge_into_base();
    r.merged = test::trainer_weights(t);
  }
  return r;
}

// The CPU run, the GPU's straight and split runs of `make` (a config under a directory), and
// their comparison: GPU straight == GPU split bit for bit; GPU within `tol` of the CPU at every
// step and in the validation loss, relative to the CPU's loss or to 0.1 where it is smaller (a
// DPO loss heading for 0); under LoRA the merged weights within `wtol`.
template <typename Make>
void check_against_cpu(Make make, int steps, double tol, double wtol = 1e-4) {
  test::TempDir a("cudapost_cpu"), b("cudapost_gpu"), s("cudapost_split");
  const Curve cpu = train(a.str(), make, nullptr, steps, 0);
  const Curve gpu = train(b.str(), make, test::gpu(), steps, 0);
  const Curve split = train(s.str(), make, test::gpu(), steps, steps / 2);
  EXPECT_EQ(split.loss, gpu.loss) << "the resumed GPU run differs from the straight one";
  ASSERT_EQ(split.weights.size(), gpu.weights.size());
  EXPECT_EQ(
      0, std::memcmp(split.weights.data(), gpu.weights.data(), gpu.weights.size() * sizeof(float)));
  ASSERT_EQ(cpu.loss.size(), gpu.loss.size());
  for (size_t i = 0; i < cpu.loss.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu.loss[i])) << "step " << i;
    EXPECT_LT(std::abs(gpu.loss[i] - cpu.loss[i]) / std::max(std::abs(cpu.loss[i]), 0.1), tol)
        << "step " << i << ": cuda " << gpu.loss[i] << " cpu " << cpu.loss[i];
  }
  EXPECT_LT(std::abs(gpu.valid - cpu.valid) / std::max(std::abs(cpu.valid), 0.1), tol)
      << "validation: cuda " << gpu.valid << " cpu " << cpu.valid;
  ASSERT_EQ(gpu.merged.size(), cpu.merged.size());
  float worst = 0;
  for (size_t i = 0; i < cpu.merged.size(); ++i)
    worst = std::max(worst, std::abs(gpu.merged[i] - cpu.merged[i]));
  EXPECT_LT(worst, wtol) << "merged LoRA weights: largest difference";
  std::printf("loss: cpu %.5f -> %.5f, cuda %.5f -> %.5f\n", cpu.loss.front(), cpu.loss.back(),
              gpu.loss.front(), gpu.loss.back());
}

// cuda_train_util.h's tiny GPT-2 with `extra` keys set.
auto tiny_with(std::vector<std::pair<std::string, std::string>> extra) {
  return [extra](const std::string& dir) {
    Config c = test::tiny_train_config(dir, "tiny", 8, 0);
    for (const auto& [k, v] : extra) c.set(k, v, "test");
    return c;
  };
}

// LoRA over a base pretrained for two CPU steps (weights only).
auto lora_with(std::vector<std::pair<std::string, std::string>> extra) {
  return [extra](const std::string& dir) {
    Config c = test::tiny_train_config(dir, "tiny", 8, 0);
    test::lora_over_base(c, test::tiny_train_config(dir, "tiny", 2, 2), dir, 2);
    for (const auto& [k, v] : extra) c.set(k, v, "test");
    return c;
  };
}

// DPO of a tiny Llama on the pairs of train/preference_pairs.h; `lora`: of adapters over a
// base that one full-DPO step on the CPU saved (weights only).
auto dpo_with(bool lora, std::vector<std::pair<std::string, std::string>> extra) {
  return [lora, extra](const std::string& dir) {
    Config c = test::tiny_dpo_config(
        dir,
        "[train]\nmicro_batch = 4\nseq_len = 48\ngrad_accum = 2\n"
        "quiet = true\nsteps = 8\npeak_gflops = 100\neval_interval = 1000\neval_batches = 2\n"
        "clip_grad = 1.0\n"
        "tensorboard = false\n[optim]\nlr = 1e-3\nwarmup_steps = 2\n");
    if (lora) {
      const Config base = c;
      test::lora_over_base(c, base, dir, 1);
    }
    c.set("train.out_dir", quoted(dir + "/run"), "test");
    for (const auto& [k, v] : extra) c.set(k, v, "test");
    return c;
  };
}

}  // namespace

// ZeRO-3 in one process: blocks released (a device fill) after use and gathered back from the
// fp32 master shard (device copies) before the next; per-rank checkpoint parts.
TEST(CudaTrainPost, Zero3TracksTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  check_against_cpu(tiny_with({{"parallel.zero", "3"}}), 8, 1e-3);
}

// Gradients rounded to bf16 for the reduction (Backend::convert on the device) at ZeRO-0 and
// ZeRO-2: rounding makes CPU and GPU gradients that differ in their last bits differ by a bf16
// step now and then, hence the bf16 tolerance.
TEST(CudaTrainPost, Bf16GradReductionTracksTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  for (const char* zero : {"0", "2"}) {
    SCOPED_TRACE(zero);
    check_against_cpu(
        tiny_with({{"parallel.grad_reduce_dtype", "\"bf16\""}, {"parallel.zero", zero}}), 8, 1e-2);
  }
}

// LoRA in fp32 (adapters' GEMMs on the device, merged weights by a device GEMM), in bf16 under
// ZeRO-3 (the frozen base sharded and gathered in device memory), and with dropout.
TEST(CudaTrainPost, LoraTracksTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  check_against_cpu(lora_with({}), 8, 1e-3);
  check_against_cpu(lora_with({{"precision.policy", "\"bf16\""}, {"parallel.zero", "3"}}), 8, 1e-2,
                    1e-2);
  // Dropout: the same mask bits on both (drawn on the host), applied on the device.
  check_against_cpu(lora_with({{"lora.dropout", "0.25"}}), 8, 1e-3);
}

// Full DPO (the reference a second Decoder on the GPU), DPO under ZeRO-3 (policy and reference
// sharded) and DPO of LoRA adapters (the reference is the base, adapters detached).
TEST(CudaTrainPost, DpoTracksTheCpuTrainer) {
  LOOM_REQUIRE_GPU();
  check_against_cpu(dpo_with(false, {}), 8, 1e-3);
  check_against_cpu(dpo_with(false, {{"parallel.zero", "3"}}), 8, 1e-3);
  check_against_cpu(dpo_with(true, {}), 8, 1e-3);
}
