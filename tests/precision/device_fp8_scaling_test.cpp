// The GPU recipe's delayed-scaling state (precision/device_fp8_scaling.h) over the guarded CPU
// backend (tests/kernels/guarded_backend.h: its buffers fault when the host touches them outside
// an op, as device memory would read garbage) against the CPU recipe, bit for bit, step by step
// (fp8_scaling_check.h): history rolls with a short ring, a tensor left out of a step, a
// non-finite amax, an evaluation pass that records nothing, and checkpoints that cross both
// ways (the device state restored from the CPU recipe's and the CPU recipe restored from the
// device's, then both go on). The guarded runs happen in a child process (a death test that
// must exit 0), so a fault fails its test only. Bad checkpoint states are refused naming the
// layer, with nothing changed; a state without layers (a bf16 pipeline stage) is the CPU
// recipe's empty one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "fp8_scaling_check.h"
#include "kernels/guarded_backend.h"

using namespace loom;

namespace {

Fp8Options delayed(bool hybrid, int margin, int len, bool most_recent) {
  Fp8Options o;
  o.kind = Fp8RecipeKind::TensorwiseDelayed;
  o.hybrid = hybrid;
  o.margin = margin;
  o.amax_history = len;
  o.most_recent = most_recent;
  return o;
}

// `steps` training steps of three layers on `p` from step `first`: layer 1 skips its backward at
// step 2 (no dy amax: its dy history must not move), layer 2's x is not finite at step 5 (that
// amax is not recorded, the step's others are), and after step 3 an evaluation pass with
// large values runs unrecorded. Compared after every step.
std::string run_steps(test::Fp8ScalingPair& p, int first, int steps) {
  std::string bad;
  for (int s = first; s < first + steps; ++s) {
    for (int i = 0; i < 3; ++i) {
      test::Fp8StepTensors d = test::fp8_step_tensors(s, i, 0);
      if (s == 5 && i == 2) d.x[7] = std::numeric_limits<float>::infinity();
      p.feed(size_t(i), d, !(s == 2 && i == 1));
    }
    if (s == 3) {
      p.set_recording(false);
      test::Fp8StepTensors big = test::fp8_step_tensors(s, 0, 0);
      for (float& v : big.x) v *= 1e4f;
      for (int i = 0; i < 3; ++i) p.feed(size_t(i), big, false);
      p.set_recording(true);
    }
    p.begin_step(nullptr, nullptr);
    bad += p.compare(cat("step ", s));
  }
  return bad;
}

// In the child: exits 0 only when the guarded device state equals the CPU recipe throughout.
[[noreturn]] void guarded_child(const Fp8Options& o) {
  std::string bad;
  try {
    test::GuardedBackend g;
    test::Fp8ScalingPair a(g, o, 3);
    bad += run_steps(a, 0, 4);
    // The pending amaxes a checkpoint between steps holds: both recorded step 4, neither rolled.
    for (int i = 0; i < 3; ++i) a.feed(size_t(i), test::fp8_step_tensors(4, i, 0), true);
    bad += a.compare("before the checkpoint");
    if (!a.scales_moved()) bad += "the scales never moved from 1 (no roll ran)\n";
    // Across: the device state from the CPU recipe's checkpoint, the CPU recipe from the device's.
    const Json cpu_state = a.reference_state(), device_state = a.device().state();
    test::Fp8ScalingPair b(g, o, 3);
    b.device().restore(&cpu_state, "cpu checkpoint");
    for (size_t i = 0; i < 3; ++i)
      b.reference(i).restore(device_state.at("layers").at(b.names()[i]), "device checkpoint");
    bad += b.compare("restored");
    // Both go on as the uninterrupted pair does (step 4's amaxes are pending in all three).
    a.begin_step(nullptr, nullptr);
    b.begin_step(nullptr, nullptr);
    bad += a.compare("step 4") + b.compare("step 4, restored");
    bad += run_steps(a, 5, 4) + run_steps(b, 5, 4);
    if (a.device().state().dump() != b.device().state().dump())
      bad += "the restored run's state differs from the uninterrupted one's\n";
    if (g.ops() < 200) bad += "too few ops went through the guarded backend\n";
  } catch (const std::exception& e) {
    bad += cat("threw: ", e.what(), "\n");
  }
  if (!bad.empty()) std::fprintf(stderr, "%s", bad.c_str());
  std::exit(bad.empty() ? 0 : 1);
}

}  // namespace

TEST(DeviceFp8Scaling, GuardedStateEqualsCpuRecipeStepByStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Hybrid (dy e5m2), margin 1, a ring of 3 (wraps within the run), max over the history.
  EXPECT_EXIT(guarded_child(delayed(true, 1, 3, false)), ::testing::ExitedWithCode(0), "");
}

TEST(DeviceFp8Scaling, GuardedMostRecentEqualsCpuRecipe) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(delayed(false, 0, 4, true)), ::testing::ExitedWithCode(0), "");
}

// A state whose layers or history length do not fit is refused naming where and what, and the
// device state is left as it was.
TEST(DeviceFp8ScalingBadInput, MismatchedStatesAreRefusedWithNothingChanged) {
  const Fp8Options o = delayed(true, 0, 3, false);
  test::Fp8ScalingPair p(cpu_backend(), o, 2);
  for (int s = 0; s < 2; ++s) {
    for (int i = 0; i < 2; ++i) p.feed(size_t(i), test::fp8_step_tensors(s, i, 0), true);
    p.begin_step(nullptr, nullptr);
  }
  const std::string before = p.device().state().dump();
  auto refused = [&](Json j, const std::string& want) {
    try {
      p.device().restore(&j, "ckpt/step_7");
      ADD_FAILURE() << "accepted: " << want;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("ckpt/step_7"), std::string::npos) << m;
      EXPECT_NE(m.find(want), std::string::npos) << m;
    }
    EXPECT_EQ(p.device().state().dump(), before) << "a refused restore changed the state";
  };
  Json longer = p.device().state();
  longer["amax_history"] = 5;
  refused(longer, "fp8_amax_history is 3");
  test::Fp8ScalingPair other(cpu_backend(), o, 3);  // a third layer the run does not have
  refused(other.device().state(), "fp8 state for 3 layers, but this run has 2");
  // A corrupt entry in the last layer: nothing of the first may be applied either.
  Json corrupt = p.device().state();
  Json t0 = corrupt.at("layers").at("blocks.1.mlp.fc").as_array()[0];
  t0["scale"] = Json(int64_t(0x7fc00000));  // NaN
  Json tensors = Json::array();
  tensors.push_back(t0);
  tensors.push_back(corrupt.at("layers").at("blocks.1.mlp.fc").as_array()[1]);
  tensors.push_back(corrupt.at("layers").at("blocks.1.mlp.fc").as_array()[2]);
  Json layers = corrupt.at("layers");
  layers["blocks.1.mlp.fc"] = tensors;
  corrupt["layers"] = layers;
  refused(corrupt, "fp8 state of blocks.1.mlp.fc");
}

// A pipeline stage whose blocks all stay bf16 holds no fp8 layer: its state is the CPU recipe's
// empty one (an empty layer map), a step rolls nothing, its own state restores, and a state with
// layers is refused (the checkpoint belongs to another layout).
TEST(DeviceFp8Scaling, NoLayersIsTheCpuRecipesEmptyState) {
  const Fp8Options o = delayed(true, 0, 3, false);
  DeviceFp8Scaling empty(cpu_backend(), o, {});
  EXPECT_EQ(empty.size(), 0u);
  empty.begin_step(nullptr);
  const Json s = empty.state();
  EXPECT_EQ(s.dump(), fp8_recipes_state(3, {}, {}).dump());
  EXPECT_TRUE(s.at("layers").as_object().empty());
  empty.restore(&s, "ckpt/step_3");
  test::Fp8ScalingPair two(cpu_backend(), o, 2);
  const Json other = two.device().state();
  try {
    empty.restore(&other, "ckpt/step_3");
    ADD_FAILURE() << "a state with 2 layers was accepted by a stage with none";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8 state for 2 layers, but this run has 0"),
              std::string::npos)
        << e.what();
  }
}
