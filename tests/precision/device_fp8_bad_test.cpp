// The FP8 recipes on a device (precision/device_fp8.h), host-side: which layers the [precision]
// keys select for the GPU recipe (the CPU recipe's, fp8_keep_first / fp8_keep_last included),
// and what check_device_fp8 refuses, by name, before a model is allocated: a backend without
// fp8 recipes, per-tensor scaling below sm_89 (refused, not a silent fallback; mxfp8 runs
// there), micro-batches that are not a multiple of 16 tokens. Delayed scaling over several
// data-parallel ranks runs (its amaxes are max-reduced over them, device_fp8_scaling_test.cpp
// and tests/parallel/fp8_device_amax_test.cpp). The GPU side: tests/cuda/cuda_train_fp8_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "model/decoder.h"
#include "model/model_config.h"
#include "precision/device_fp8.h"
#include "precision/fp8_recipes.h"

using namespace loom;

namespace {

Fp8Options from(const std::string& precision_keys, int n_layer) {
  Config c = Config::parse("[precision]\n" + precision_keys, "test.toml");
  Fp8Options o;
  EXPECT_TRUE(Fp8Options::from(c, n_layer, &o));
  return o;
}

DeviceFp8Target h100(int dp_ranks = 1, int tokens = 4096) {
  DeviceFp8Target t;
  t.cuda = true;
  t.sm_version = 90;
  t.dp_ranks = dp_ranks;
  t.tokens = tokens;
  return t;
}

// check_device_fp8 throws an error containing every one of `what`.
void expect_refused(const Fp8Options& o, const DeviceFp8Target& t,
                    const std::vector<std::string>& what) {
  try {
    check_device_fp8(o, t, "train.device = \"cuda\": ");
    ADD_FAILURE() << "no error; expected one containing: " << what.front();
  } catch (const Error& e) {
    for (const std::string& w : what)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

}  // namespace

// The keys pick the same linears for the GPU recipe as for the CPU one: blocks 1 and 2 of 4
// with fp8_keep_first = 1 and fp8_keep_last = 1, the head never.
TEST(DeviceFp8Config, KeysSelectTheCpuRecipesLayers) {
  ModelConfig mc = model_preset("tiny");
  mc.n_layer = 4;
  Decoder m(mc, cpu_backend());
  const Fp8Options o = from(
      "fp8_recipe = \"fp8_tensorwise_delayed\"\nfp8_keep_first = 1\nfp8_keep_last = 1\n"
      "fp8_format = \"hybrid\"\nfp8_amax_history = 16\n",
      mc.n_layer);
  EXPECT_EQ(o.kind, Fp8RecipeKind::TensorwiseDelayed);
  EXPECT_TRUE(o.hybrid);
  EXPECT_EQ(o.amax_history, 16);
  const std::vector<std::string> names = fp8_layer_names(m, o);
  ASSERT_FALSE(names.empty());
  for (const std::string& n : names) {
    EXPECT_TRUE(n.rfind("blocks.1.", 0) == 0 || n.rfind("blocks.2.", 0) == 0) << n;
  }
  size_t block_linears = 0;
  for (const auto& l : m.linears()) block_linears += l.name.rfind("blocks.", 0) == 0;
  EXPECT_EQ(names.size(), block_linears / 2);  // two of four blocks
  Fp8Recipes cpu(m, o);
  EXPECT_EQ(cpu.names(), names);
}

TEST(DeviceFp8BadInput, RecipesThatCannotRunAreRefusedByName) {
  const Fp8Options current = from("fp8_recipe = \"fp8_tensorwise_current\"\n", 2);
  const Fp8Options delayed = from("fp8_recipe = \"fp8_tensorwise_delayed\"\n", 2);
  const Fp8Options mx = from("fp8_recipe = \"mxfp8\"\n", 2);
  // What runs.
  EXPECT_NO_THROW(check_device_fp8(current, h100(), ""));
  EXPECT_NO_THROW(check_device_fp8(delayed, h100(), ""));
  EXPECT_NO_THROW(check_device_fp8(current, h100(8), ""));  // current scaling: any DP size
  EXPECT_NO_THROW(check_device_fp8(mx, h100(8), ""));
  DeviceFp8Target a100 = h100();
  a100.sm_version = 80;
  EXPECT_NO_THROW(check_device_fp8(mx, a100, ""));  // emulated on bf16 tensor cores
  // A GPU without fp8 tensor cores: refused, naming the recipe and the SM (no fallback).
  for (const Fp8Options& o : {current, delayed})
    expect_refused(o, a100,
                   {"train.device = \"cuda\": ", "precision.fp8_recipe = \"",
                    fp8_recipe_name(o.kind), "sm_89 or newer", "this GPU is sm_80"});
  // Not the CUDA backend (a host-inaccessible test backend, or a future device).
  DeviceFp8Target other = h100();
  other.cuda = false;
  expect_refused(mx, other, {"precision.fp8_recipe = \"mxfp8\"", "CUDA backend only"});
  // Delayed scaling over data-parallel ranks: accepted (the step amaxes are max-reduced).
  EXPECT_NO_THROW(check_device_fp8(delayed, h100(2), ""));
  // Tokens per micro-batch not a multiple of 16, and none.
  expect_refused(current, h100(1, 24), {"multiple of 16 tokens", "got 24"});
  expect_refused(current, h100(1, 0), {"multiple of 16 tokens", "got 0"});
}

// Under context parallelism a rank multiplies its share of the micro-batch, tokens / cp: the
// alignment holds for the share, not the whole micro-batch.
TEST(DeviceFp8BadInput, ContextParallelSharesAreAlignedTo16Tokens) {
  const Fp8Options current = from("fp8_recipe = \"fp8_tensorwise_current\"\n", 2);
  DeviceFp8Target t = h100(1, 32);  // 2 x 16: a multiple of 16, whose share over cp = 4 is 8
  t.cp = 4;
  expect_refused(current, t,
                 {"multiple of 16 tokens per micro-batch and context-parallel rank",
                  "got 32 tokens over 4 ranks", "train.micro_batch x train.seq_len / parallel.cp",
                  "multiple of 64"});
  t.cp = 2;  // shares of 16
  EXPECT_NO_THROW(check_device_fp8(current, t, ""));
  t.tokens = 48;  // 3 x 16, but not divisible by cp = 2 into whole multiples of 16
  expect_refused(current, t, {"context-parallel rank", "got 48 tokens over 2 ranks"});
  t.tokens = 64;
  EXPECT_NO_THROW(check_device_fp8(current, t, ""));
}

// On the CPU backend (or in a build without CUDA) the device attach refuses, naming the key,
// and attaches nothing.
TEST(DeviceFp8BadInput, AttachingOnTheCpuBackendIsRefused) {
  ModelConfig mc = model_preset("tiny");
  mc.n_layer = 1;
  Decoder m(mc, cpu_backend());
  const Fp8Options o = from("fp8_recipe = \"mxfp8\"\n", 1);
  EXPECT_THROW(attach_device_fp8_recipes(o, m, cpu_backend(), 1, 64, "--fp8: ", true), Error);
}
