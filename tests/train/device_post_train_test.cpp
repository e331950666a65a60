// Post-training on a device backend, proven without a GPU over the guarded CPU backend (see
// train/guarded_trainer_run.h): LoRA (the adapters' GEMMs and their scratch, dropout, their
// optimizer, checkpoints of adapters only, the merged weights an export writes) and DPO (the frozen
// reference's forward, the sequence log-probabilities read back, the per-token weights of the
// DPO gradient uploaded with the micro-batch), each with a checkpoint and a resume, bit for bit
// equal to the same run on the CPU backend. Under ZeRO-3 the frozen weights (LoRA's base, DPO's
// reference) are sharded and gathered block by block in Backend memory (FrozenShards).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/fs.h"
#include "precision/guarded_fp8_recipes.h"
#include "train/guarded_trainer_run.h"
#include "train/trainer.h"
#include "train/trainer_setups.h"

using namespace loom;

namespace {

using test::quoted;

// ---- LoRA: a tiny model pretrained for two steps on the CPU, then adapted.

// The LoRA run of `family` under `dir`: its base pretrained first (two CPU steps, weights
// only), then adapters on every linear layer of the blocks (rank 4).
Config lora_config(const std::string& dir, const std::string& family, int zero,
                   const std::string& precision, double dropout) {
  Config c = test::guarded_run_config(dir, family, dir + "/run");
  Config base = test::guarded_run_config(dir, family, dir + "/base");
  base.set("train.eval_interval", "0", "test");
  test::lora_over_base(c, base, dir, 2);
  c.set("precision.policy", quoted(precision), "test");
  if (zero > 0) c.set("parallel.zero", std::to_string(zero), "test");
  if (dropout > 0) c.set("lora.dropout", std::to_string(dropout), "test");
  return c;
}

// The CPU run must really have trained adapters: B starts at zero, so after six steps some of
// the adapters' weights are non-zero, and merging them changes the base.
std::string lora_trained(const test::GuardedRun& want) {
  bool moved = false;
  for (float v : want.adapters) moved |= v != 0.f;
  if (want.adapters.empty() || !moved) return " (the adapters did not train)";
  if (test::same_bits(want.merged, want.values)) return " (merging changed nothing)";
  return "";
}

// ---- DPO (the pairs of train/preference_pairs.h).

// Full DPO (the reference a second Decoder on the backend) or, with `lora`, DPO of adapters
// (the reference is the base, the adapters detached); two micro-batches of one pair a step.
Config dpo_config(const std::string& d, int zero, const std::string& precision, bool lora) {
  Config c = test::tiny_dpo_config(
      d,
      "[train]\nmicro_batch = 2\nseq_len = 48\ngrad_accum = 2\nquiet = true\n"
      "steps = 6\npeak_gflops = 100\ncheckpoint_interval = 3\neval_interval = 3\n"
      "eval_batches = 2\nclip_grad = 0.5\ntensorboard = false\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\n");
  c.set("precision.policy", quoted(precision), "test");
  if (zero > 0) c.set("parallel.zero", std::to_string(zero), "test");
  if (lora) {
    // The base LoRA needs (train.pretrained): the same model after one full-DPO step on the
    // CPU, weights only.
    Config base = c;
    base.set("train.eval_interval", "0", "test");
    base.set("precision.policy", "\"fp32\"", "test");
    if (zero > 0) base.set("parallel.zero", "0", "test");
    test::lora_over_base(c, base, d, 1);
  }
  c.set("train.out_dir", quoted(d + "/run"), "test");
  return c;
}

// The CPU run's DPO figures (rewards, margin, accuracy per step) must be there and not all
// zero: a run whose policy never moved from its reference would show zero rewards.
std::string dpo_ran(const test::GuardedRun& want) {
  if (want.extra.size() != 6 * 4) return " (no DPO step figures)";
  bool moved = false;
  for (double v : want.extra) moved |= v != 0 && v != 1;  // (accuracy alone may be 0 or 1)
  return moved ? "" : " (the policy never left its reference)";
}

[[noreturn]] void lora_child(const std::string& family, int zero, const std::string& precision,
                             double dropout = 0) {
  test::guarded_child(
      [&](const std::string& dir) { return lora_config(dir, family, zero, precision, dropout); },
      lora_trained);
}

[[noreturn]] void dpo_child(int zero, const std::string& precision, bool lora) {
  test::guarded_child(
      [&](const std::string& dir) { return dpo_config(dir, zero, precision, lora); },
      [&](const test::GuardedRun& want) {
        return dpo_ran(want) + (lora ? lora_trained(want) : std::string());
      });
}

// DPO with an fp8 recipe on the device: the stand-in GPU recipe (precision/guarded_fp8_recipes.h)
// refuses a forward larger than the tokens it was attached for, as the CUDA recipe's scratch
// does, and DPO's forwards hold each pair's chosen and rejected rows (twice train.micro_batch):
// the trainer must size the recipe for those. Then the run equals the CPU recipe's bit for bit.
[[noreturn]] void dpo_fp8_child(const std::string& recipe) {
  setenv("LOOM_BF16_GEMM", "fallback", 1);  // the CPU recipe's GEMMs in one summation order
  auto make = [&](const std::string& dir) {
    Config c = dpo_config(dir, 0, "fp32", false);
    c.set("precision.fp8_recipe", quoted(recipe), "test");
    c.set("precision.fp8_format", "\"hybrid\"", "test");
    return c;
  };
  test::GuardedRun want, got;
  test::GuardedBackend g;
  g.set_strict(true);
  test::GuardedFp8Recipes::Registration stand_in(g);
  try {
    test::TempDir a("devdpo8_cpu"), b("devdpo8_guarded");
    want = test::train_and_resume(a.str(), make, nullptr);
    got = test::train_and_resume(b.str(), make, &g);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run threw: %s\n", e.what());
    std::exit(2);
  }
  std::string bad = dpo_ran(want) + test::guarded_differences(want, got, g);
  if (stand_in.counts.gemms == 0) bad += " (no fp8 GEMM ran on the device)";
  if (!bad.empty())
    std::fprintf(stderr, "guarded trainer differs from the CPU one:%s\n", bad.c_str());
  std::exit(bad.empty() ? 0 : 1);
}

}  // namespace

// LoRA on GPT-2 (fp32, the adapters' engine at ZeRO-0: whole checkpoints of adapters only) and
// on Llama (bf16, ZeRO-3: the frozen base sharded and gathered block by block in Backend
// memory, the adapters' gradients and optimizer state sharded as ZeRO-2 does; per-rank parts).
// With dropout: the mask drawn on the host, its bits uploaded and applied by
// Backend::apply_bit_mask into Backend scratch (forward, and backward's input gradient).
TEST(DevicePostTrain, GuardedLoraRunsEqualCpuRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(lora_child("gpt2", 0, "fp32"), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(lora_child("llama", 3, "bf16"), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(lora_child("gpt2", 0, "fp32", 0.25), ::testing::ExitedWithCode(0), "");
}

// Full DPO in fp32 (the reference a whole Decoder on the backend, copied from the policy by a
// Backend copy) and in bf16 under ZeRO-3 (policy and reference both sharded: the reference's
// shard copied from the policy's master and rounded on the backend).
TEST(DevicePostTrain, GuardedDpoRunsEqualCpuRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(dpo_child(0, "fp32", false), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(dpo_child(3, "bf16", false), ::testing::ExitedWithCode(0), "");
}

// DPO of LoRA adapters: the reference forward is the base with the adapters detached.
TEST(DevicePostTrain, GuardedLoraDpoRunEqualsCpuRun) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(dpo_child(0, "fp32", true), ::testing::ExitedWithCode(0), "");
}

// DPO with fp8 current scaling on the device (the stand-in recipe): sized for DPO's doubled
// forwards, equal to the CPU recipe's run.
TEST(DevicePostTrain, GuardedFp8DpoRunEqualsCpuRun) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(dpo_fp8_child("fp8_tensorwise_current"), ::testing::ExitedWithCode(0), "");
}
