// Lazy gradient zeroing (model/grad_zeroing.h): zero_grad() skips the ranges the bf16
// weight-gradient GEMMs overwrite whole, and every reader settles what no writer overwrote. The
// bookkeeping alone, then through a Decoder with the bf16 GEMMs: a step after a lazily zeroed
// one gives the gradients of a fully zeroed one bit for bit, and a gradient no writer touched
// (a linear without rows) reads zero through every reader, never the previous step's values.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_bf16.h"
#include "model/decoder.h"
#include "model/grad_zeroing.h"
#include "precision/bf16_gemms.h"
#include "small_bf16_models.h"

using namespace loom;

TEST(GradZeroing, ZeroFillsOnlyOutsideAllowedRangesAndSettleFillsPendingOnce) {
  GradZeroing z;
  z.allow(10, 20);
  z.allow(30, 35);
  z.allow(10, 20);  // again: kept once
  EXPECT_EQ(z.allowed(), 2u);
  std::vector<float> g(40, 7.f);
  auto fill = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) g[size_t(i)] = 0.f;
  };
  z.zero(40, fill);
  for (int i = 0; i < 40; ++i) {
    const bool lazy = (i >= 10 && i < 20) || (i >= 30 && i < 35);
    EXPECT_EQ(g[size_t(i)], lazy ? 7.f : 0.f) << i;
  }
  EXPECT_TRUE(z.pending(0, 40));
  z.overwritten(10, 20);  // its writer wrote it whole
  EXPECT_FALSE(z.pending(10, 20));
  EXPECT_TRUE(z.pending(34, 36));
  g[15] = 3.f;                          // the writer's value stays
  EXPECT_EQ(z.settle(0, 31, fill), 1);  // [30, 35) overlaps: filled whole
  EXPECT_EQ(g[15], 3.f);
  for (int i = 30; i < 35; ++i) EXPECT_EQ(g[size_t(i)], 0.f) << i;
  EXPECT_EQ(z.settle(0, 40, fill), 0);  // nothing pending any more
  EXPECT_FALSE(z.pending(0, 40));
  // A range overlapping an allowed one differently: two first writers cannot both be.
  EXPECT_THROW(z.allow(15, 25), Error);
  EXPECT_THROW(z.allow(5, 11), Error);
  EXPECT_THROW(z.allow(3, 3), Error);
  GradZeroing beyond;
  beyond.allow(0, 50);
  EXPECT_THROW(beyond.zero(40, fill), Error);
}

namespace {

struct Model {
  Decoder m;
  std::unique_ptr<Bf16Gemms> recipe;
  explicit Model(Family f)
      : m(test::small_bf16_model(f), cpu_backend(), Recompute::None, DType::BF16) {
    m.params().init(8);
    round_to(DType::BF16, m.params().data(), size_t(m.params().total()));
    recipe = attach_bf16_gemms(m, true);
  }
};

}  // namespace

TEST(GradZeroing, LazilyZeroedStepEqualsFullyZeroedStep) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  for (Family f : {Family::GPT2, Family::Llama}) {
    Model a(f), b(f);
    ASSERT_NE(a.recipe, nullptr);
    ParamSet &P = a.m.params(), &Q = b.m.params();
    const test::SmallBatch d1 = test::small_batch(2, 32, 21), d2 = test::small_batch(2, 32, 22);
    P.zero_grad();
    a.m.forward_backward(d1.input(), 1.f / 64);
    P.zero_grad();  // lazily: the linears' weights keep d1's gradients until overwritten
    EXPECT_TRUE(P.grads_pending(0, P.total())) << family_name(f);
    const ParamInfo& wte = P.info(P.has("head.weight") ? "head.weight" : "embed.wte");
    bool stale = false;  // (the skipped memset left d1's values: lazy zeroing is in force)
    for (int64_t i = 0; i < wte.numel && !stale; ++i) stale = P.grad()[wte.offset + i] != 0.f;
    EXPECT_TRUE(stale) << family_name(f);
    a.m.forward_backward(d2.input(), 1.f / 64);
    EXPECT_FALSE(P.grads_pending(0, P.total())) << family_name(f);

    Q.zero_grad();  // the first zero_grad of a set: every element filled
    b.m.forward_backward(d2.input(), 1.f / 64);
    EXPECT_EQ(0, std::memcmp(P.grad(), Q.grad(), sizeof(float) * size_t(P.total())))
        << family_name(f);
  }
}

TEST(GradZeroing, GradientNoWriterTouchedReadsZero) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) GTEST_SKIP() << "no AVX512-BF16 here";
  Model a(Family::GPT2);
  ASSERT_NE(a.recipe, nullptr);
  ParamSet& P = a.m.params();
  const test::SmallBatch d = test::small_batch(2, 32, 23);
  P.zero_grad();
  a.m.forward_backward(d.input(), 1.f / 64);
  const int64_t n = P.total();
  const ParamInfo& fc = P.info(a.m.linears()[2].name + ".weight");
  const int64_t lo = fc.offset, hi = fc.offset + fc.numel;

  // read_grads after a zero_grad and no backward: zeros, not the last step's gradients.
  P.zero_grad();
  std::vector<float> got(size_t(n), 1.f);
  P.read_grads(0, n, got.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], 0.f) << i;

  // A linear whose backward gets no rows (an MoE expert without tokens): its GEMM never writes
  // dW, and the end of the backward (Decoder::embed_backward) settles it to zero.
  P.zero_grad();
  const Decoder::LinearInfo lin = a.m.linears()[2];  // linears() returns a vector by value
  EXPECT_TRUE(P.grads_pending(lo, hi));
  a.recipe->backward(cpu_backend(), nullptr, P.grad() + lo, nullptr, nullptr, ActIn(),
                     P.data() + lo, 0, lin.in, lin.out);
  EXPECT_TRUE(P.grads_pending(lo, hi));  // no rows: nothing written
  P.settle_grads(lo, lo + 1);            // a reader of part of it (a reducer's bucket)
  EXPECT_FALSE(P.grads_pending(lo, hi));
  for (int64_t i = lo; i < hi; ++i) ASSERT_EQ(P.grad()[i], 0.f) << i;
  // The other linears are still pending, and the Decoder's backward settles what it does not
  // overwrite: run one and every element is written or zero.
  EXPECT_TRUE(P.grads_pending(0, n));
  a.m.forward_backward(d.input(), 1.f / 64);
  EXPECT_FALSE(P.grads_pending(0, n));
}
