// The backend-parametrised step checks (model/step_check.h) on this machine: the "device" run is
// the CPU backend itself (every check must hold with zero tolerance: the same ops, bit for bit)
// and the guarded backend (buffers the host cannot touch, in a child process), so the checks'
// own logic and staging are exercised where there is no GPU; tests/cuda/cuda_step_test.cpp runs
// the same bodies over CudaBackend. The last tests show the comparison catches what it must.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include <set>
#include <string>

#include "kernels/guarded_backend.h"
#include "kernels/tap_backend.h"
#include "model/step_check.h"

using namespace loom;

namespace {

using test::StepRun;
using test::StepSpec;
using test::StepTol;

const StepTol kExact{};  // every tolerance 0

StepSpec spec(Family f, Recompute rc = Recompute::None, DType act = DType::F32) {
  StepSpec s;
  s.cfg = test::tiny(f);
  s.lens = {9, 7, 12};
  s.recompute = rc;
  s.act = act;
  return s;
}

// Frozen: a block matrix, a norm and (GPT-2) the position table or (Llama) the untied head.
std::vector<std::string> some_frozen(Family f) {
  return {"blocks.1.attn.qkv.weight", "blocks.0.norm2.weight",
          f == Family::GPT2 ? "embed.wpe" : "head.weight"};
}

TEST(BackendStep, CpuAgreesWithItselfInEveryMode) {
  for (Family f : {Family::GPT2, Family::Llama})
    for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full})
      for (DType act : {DType::F32, DType::BF16}) {
        StepSpec s = spec(f, rc, act);
        s.loss_weights = rc != Recompute::None;
        if (rc == Recompute::Full) s.frozen = some_frozen(f);
        const StepRun want = test::cpu_reference(s);
        EXPECT_TRUE(test::steps_agree(test::run_step(cpu_backend(), s), want, kExact))
            << family_name(f) << " " << recompute_name(rc) << " " << dtype_name(act);
        EXPECT_GT(want.loss, 0.0);
        EXPECT_EQ(want.out.seq_logprobs.size(), 3u);
      }
}

// The checks over buffers the host cannot touch: a host read of a device pointer in the harness
// (or in the Decoder) faults in the child, which then exits non-zero.
[[noreturn]] void guarded_child(Family f, Recompute rc, DType act) {
  StepSpec s = spec(f, rc, act);
  s.loss_weights = true;
  s.frozen = some_frozen(f);
  const StepRun want = test::cpu_reference(s);
  test::GuardedBackend g;
  g.set_strict(true);  // no host scratch handed to an op either
  bool ok = false;
  try {
    const auto r = test::steps_agree(test::run_step(g, s), want, kExact);
    if (!r) std::fprintf(stderr, "%s\n", r.message());
    const auto c =
        test::curves_agree(test::train_curve(g, s, 3), test::train_curve(cpu_backend(), s, 3), 0.0);
    if (!c) std::fprintf(stderr, "%s\n", c.message());
    ok = r && c && g.host_pointer_ops().empty();
    for (const std::string& op : g.host_pointer_ops())
      std::fprintf(stderr, "host memory given to %s\n", op.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "guarded run threw: %s\n", e.what());
  }
  std::exit(ok ? 0 : 1);
}

TEST(BackendStep, GuardedBackendAgreesWithCpu) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(Family::GPT2, Recompute::Selective, DType::F32),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child(Family::Llama, Recompute::Full, DType::BF16),
              ::testing::ExitedWithCode(0), "");
}

// The forwarding backend bench_cuda times the Decoder's op groups through: the same results as
// its inner backend, bit for bit, and every op named to the listener.
TEST(BackendStep, TapBackendForwardsEveryOp) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    StepSpec s = spec(f, Recompute::Selective, DType::BF16);
    s.loss_weights = true;
    s.frozen = some_frozen(f);
    std::set<std::string> seen;
    test::TapBackend tap(cpu_backend(), [&](const char* op) { seen.insert(op); });
    EXPECT_TRUE(test::steps_agree(test::run_step(tap, s), test::cpu_reference(s), kExact));
    EXPECT_TRUE(test::curves_agree(test::train_curve(tap, s, 3),
                                   test::train_curve(cpu_backend(), s, 3), 0.0));
    for (const char* op :
         {"matmul_forward", "matmul_backward", "attention_forward", "attention_backward",
          "cross_entropy", "weighted_sum", "embedding_forward", "embedding_backward", "round_to",
          "convert", "adamw", "copy_h2d"})
      EXPECT_EQ(seen.count(op), 1u) << op << " not seen (" << family_name(f) << ")";
    EXPECT_EQ(seen.count(f == Family::GPT2 ? "layernorm_backward" : "rmsnorm_backward"), 1u);
    EXPECT_EQ(seen.count(f == Family::GPT2 ? "gelu_forward" : "swiglu_backward"), 1u);
    if (f == Family::Llama) {
      EXPECT_EQ(seen.count("rope_backward"), 1u);
    }
  }
}

// On a GPU the Decoder runs its bf16 passes (norms, the MLP activation and its recomputation in
// backward) over all rows at once instead of cache-sized row blocks: the same values. 200
// tokens of the tiny preset take two blocks of fc on the CPU (128 rows each), one block when the
// backend says CUDA.
TEST(BackendStep, WholeRowBf16PassesOfAGpuMatchTheCpuBlocks) {
  StepSpec s;
  s.cfg = model_preset("tiny");
  s.lens = {128, 72};
  s.act = DType::BF16;
  s.loss_weights = true;
  test::TapBackend gpu_like(cpu_backend());
  gpu_like.report_device(Device::CUDA);
  EXPECT_TRUE(test::steps_agree(test::run_step(gpu_like, s), test::cpu_reference(s), kExact));
}

TEST(BackendStep, TrainCurveFallsAndRepeats) {
  const StepSpec s = spec(Family::Llama);
  const std::vector<double> a = test::train_curve(cpu_backend(), s, 4);
  EXPECT_TRUE(test::curves_agree(a, test::train_curve(cpu_backend(), s, 4), 0.0));
  std::vector<double> off = a;
  off[2] *= 1.01;
  EXPECT_FALSE(test::curves_agree(off, a, 1e-3));
}

// The comparison must fail where the device run is wrong: a bf16 run against fp32 tolerances,
// one gradient element off by 1% of its tensor's scale, a written frozen gradient, a wrong
// sequence or token log-probability, a wrong logit.
TEST(BackendStep, ComparisonCatchesDifferences) {
  const StepTol fp32{1e-5, 1e-3, 1e-4, 1e-5};
  StepSpec s = spec(Family::GPT2);
  s.frozen = some_frozen(Family::GPT2);
  const StepRun want = test::cpu_reference(s);
  ASSERT_TRUE(test::steps_agree(want, want, fp32));
  EXPECT_TRUE(want.frozen_written.empty());

  StepSpec b = s;
  b.act = DType::BF16;
  EXPECT_FALSE(test::steps_agree(test::run_step(cpu_backend(), b), want, fp32));

  const ParamInfo* pp = nullptr;
  for (const ParamInfo& i : want.infos)
    if (i.name == "blocks.0.attn.proj.weight") pp = &i;
  ASSERT_NE(pp, nullptr);
  const ParamInfo& p = *pp;
  double m = 0;
  for (int64_t i = 0; i < p.numel; ++i)
    m = std::max(m, double(std::fabs(want.grads[p.offset + i])));
  ASSERT_GT(m, 0.0);
  StepRun g = want;
  g.grads[size_t(p.offset + p.numel / 2)] += float(0.01 * m);
  EXPECT_FALSE(test::steps_agree(g, want, fp32));

  StepRun fz = want;
  fz.frozen_written.push_back("embed.wpe");
  EXPECT_FALSE(test::steps_agree(fz, want, fp32));

  StepRun lp = want;
  lp.out.seq_logprobs[1] += 0.01;
  EXPECT_FALSE(test::steps_agree(lp, want, fp32));

  StepRun tl = want;
  tl.out.token_logprobs[4] -= 0.5f;
  EXPECT_FALSE(test::steps_agree(tl, want, fp32));

  StepRun lg = want;
  lg.logits[5] = std::nanf("");
  EXPECT_FALSE(test::steps_agree(lg, want, fp32));
}

// A frozen parameter's gradient buffer keeps the sentinel run_step writes into it; the same
// parameters left trainable (freeze = false) get the sentinel too, which the step's
// accumulation overwrites: the run reports each of them written.
TEST(BackendStep, FrozenGradientWriteIsDetected) {
  StepSpec s = spec(Family::Llama);
  s.frozen = some_frozen(Family::Llama);
  const StepRun frozen = test::run_step(cpu_backend(), s);
  EXPECT_TRUE(frozen.frozen_written.empty());
  s.freeze = false;
  const StepRun written = test::run_step(cpu_backend(), s);
  EXPECT_EQ(written.frozen_written, s.frozen);
}

}  // namespace
