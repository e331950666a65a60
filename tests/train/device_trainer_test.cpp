// The Trainer on a device backend, proven here without a GPU: a run over the guarded CPU
// backend (tests/kernels/guarded_backend.h: its buffers are PROT_NONE outside its ops, so any
// host read or write of a parameter, gradient, optimizer moment or activation faults, as it
// would read garbage on a GPU), with a checkpoint, a resume and an evaluation, must equal the
// same run on the CPU backend bit for bit (train/guarded_trainer_run.h). The ops are the CPU's,
// so equality is exact; only where the host touches memory differs (staging through copy_d2h /
// copy_h2d). Each guarded run happens in a child process (a death test that must exit 0), so a
// fault fails this test only. LoRA and DPO: device_post_train_test.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "kernels/guarded_backend.h"
#include "temp_dir.h"
#include "train/guarded_trainer_run.h"
#include "train/trainer.h"

using namespace loom;

namespace {

// guarded_run_config's run; `moe`: the tiny MoE preset of the family (8 experts, top-2), whose
// router, dispatch, expert GEMMs and aux loss run through Backend ops.
Config config(const std::string& dir, const std::string& family, int zero = 0,
              const std::string& precision = "fp32", bool moe = false) {
  Config c = test::guarded_run_config(dir, family, dir + "/run", moe ? "tiny-moe" : "tiny");
  // ZeRO 1-2 in one process: the sharded optimizer, its gradient shard and bucket scratch
  // (Backend memory), per-rank checkpoint parts with a global commit.
  if (zero > 0) c.set("parallel.zero", std::to_string(zero), "test");
  c.set("precision.policy", "\"" + precision + "\"", "test");
  if (family == "llama") {
    // (and the asynchronous checkpoint writer, whose snapshot copies the staged host tensors)
    c.set("train.ckpt_async", "true", "test");
    // Capacity-limited routing: some of the 32 tokens' 64 assignments overflow an expert's 8
    // slots and are dropped (the routing plan the host reads back decides which).
    if (moe) c.set("model.capacity_factor", "1.0", "test");
  }
  return c;
}

// In the child: the run of `config(...)` on the guarded backend against the CPU one.
[[noreturn]] void guarded_child(const std::string& family, int zero = 0,
                                const std::string& precision = "fp32", bool moe = false,
                                const std::string& reduce = "fp32") {
  test::guarded_child(
      [&](const std::string& dir) {
        Config c = config(dir, family, zero, precision, moe);
        c.set("parallel.grad_reduce_dtype", "\"" + reduce + "\"", "test");
        return c;
      },
      [&](const test::GuardedRun& want) {
        // (A MoE model's aux loss is positive: a run whose router never ran would show 0.)
        return moe && !(want.aux_loss.at(0) > 0) ? std::string(" (no MoE aux loss)")
                                                 : std::string();
      });
}

}  // namespace

TEST(DeviceTrainer, GuardedRunWithCheckpointAndResumeEqualsCpuRun) {
  // Re-executes the binary for the child: OpenMP's thread pool does not survive fork().
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child("gpt2"), ::testing::ExitedWithCode(0), "");
}

TEST(DeviceTrainer, GuardedLlamaRunEqualsCpuRun) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child("llama"), ::testing::ExitedWithCode(0), "");
}

// ZeRO-1 and ZeRO-2 (one rank): the reduced gradients land in the engine's shard buffer and,
// under ZeRO-2, in per-bucket scratch added to it, all of it Backend memory; the full
// gradient buffer is zeroed by a Backend fill where the CPU returns its pages.
TEST(DeviceTrainer, GuardedZero1And2RunsEqualCpuRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child("gpt2", 1), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child("llama", 2), ::testing::ExitedWithCode(0), "");
}

// bf16 (activations stored in bf16, widened by the device recipe into Backend scratch, fp32
// master weights rounded on the backend) and fp16 (loss scaling): strict, so no GEMM input is
// host memory any more.
TEST(DeviceTrainer, GuardedBf16AndFp16RunsEqualCpuRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child("gpt2", 0, "bf16"), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child("llama", 0, "fp16"), ::testing::ExitedWithCode(0), "");
}

// ZeRO-3 in one process: the master shard is the whole model, the blocks are released (a
// Backend fill zeroes them where the CPU returns their pages) after each use and gathered back
// from the master before the next (AdamW's write_model: a Backend copy, rounded on the backend
// under bf16), the parameters outside the blocks stay; checkpoints are per-rank parts.
TEST(DeviceTrainer, GuardedZero3RunsEqualCpuRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child("gpt2", 3), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child("llama", 3, "bf16"), ::testing::ExitedWithCode(0), "");
}

// Gradients reduced in bf16 (parallel.grad_reduce_dtype): each bucket rounded to bf16 by
// Backend::convert into a Backend wire buffer, reduce-scattered (one rank: widened back by the
// device communicator's convert), summed in fp32; ZeRO-0 rounds the sums and gathers them back
// into the gradients, ZeRO-2 adds them to its shard. Strict: no host wire buffer is left.
TEST(DeviceTrainer, GuardedBf16GradReductionEqualsCpuRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child("gpt2", 0, "fp32", false, "bf16"), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child("llama", 2, "bf16", false, "bf16"), ::testing::ExitedWithCode(0), "");
}

// Mixture-of-experts models (tiny-moe, tiny-llama-moe: 8 experts, top-2) on the device: the
// router, top-k, dispatch, expert GEMMs, combine and aux loss through Backend ops, the routing
// plan read back once per layer. GPT-2 dropless in fp32; Llama with capacity-limited routing
// (dropped tokens), bf16 storage and ZeRO-1.
TEST(DeviceTrainer, GuardedMoeRunsEqualCpuRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child("gpt2", 0, "fp32", true), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child("llama", 1, "bf16", true), ::testing::ExitedWithCode(0), "");
}

// The guard must catch what it is for: a host read of a parameter of a trainer on the guarded
// backend dies (the test above would otherwise prove nothing).
TEST(DeviceTrainer, GuardCatchesAHostReadOfTheWeights) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        test::TempDir d("devtrain_fault");
        test::GuardedBackend g;
        Trainer t(config(d.str(), "gpt2"), nullptr, &g);
        t.train_step();
        volatile float x = t.model().params().data()[0];  // host read of device memory
        std::fprintf(stderr, "read %f\n", double(x));
      },
      "");
}
