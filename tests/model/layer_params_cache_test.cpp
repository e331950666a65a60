// Decoder keeps each layer's parameter pointers, adapters and recipes between passes
// (layer_params' cache): every change made after a pass (a recipe or adapter attached or
// detached, a parameter frozen or unfrozen) must show in the next pass, as it does in a fresh
// model. Each check runs a pass first, so a cache built before the change is in place.
#include <gtest/gtest.h>

#include <vector>

#include "model/decoder.h"
#include "model/model_test_util.h"
#include "same_bits.h"

using namespace loom;

namespace {

using test::Data;
using test::make_data;
using test::tiny;

// y += 0.5 x (in == out): a visible change of the layer's output.
struct HalfAdapter : LinearAdapter {
  void forward(Backend&, float* y, const float* x, int N, int) override {
    for (int64_t i = 0; i < int64_t(N) * n; ++i) y[i] += 0.5f * x[i];
  }
  void backward(Backend&, float* dx, const float* dy, const float*, int N, int) override {
    if (dx)
      for (int64_t i = 0; i < int64_t(N) * n; ++i) dx[i] += 0.5f * dy[i];
  }
  int n = 0;
};

}  // namespace

TEST(LayerParamsCache, AttachAndDetachAfterAPassTakeEffect) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend()), plain(tiny(f), cpu_backend());
    m.params().init(31);
    plain.params().init(31);
    const Data d = make_data({6, 5}, 32, 3);
    const double base = plain.forward_loss(d.input());
    EXPECT_EQ(m.forward_loss(d.input()), base);  // the cache is built here

    test::CountingRecipe r;
    m.attach_recipe("blocks.1.attn.proj", &r);
    EXPECT_EQ(m.forward_loss(d.input()), base);
    EXPECT_EQ(r.forwards, 1) << "a recipe attached after a pass was not called";
    m.attach_recipe("blocks.1.attn.proj", nullptr);
    m.forward_loss(d.input());
    EXPECT_EQ(r.forwards, 1) << "a detached recipe was still called";

    const int C = tiny(f).d_model;
    HalfAdapter a;
    a.n = C;
    m.attach_adapter("blocks.0.attn.proj", &a);
    const double adapted = m.forward_loss(d.input());
    EXPECT_NE(adapted, base) << "an adapter attached after a pass changed nothing";
    m.attach_adapter("blocks.0.attn.proj", nullptr);
    EXPECT_EQ(m.forward_loss(d.input()), base) << "a detached adapter still acts";
  }
}

TEST(LayerParamsCache, FreezingAfterAPassStopsTheGradient) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(37);
  const Data d = make_data({7}, 32, 5);
  ParamSet& P = m.params();
  const std::string name = "blocks.1.mlp.fc.weight";
  const ParamInfo& p = P.info(name);
  P.zero_grad();
  m.forward_backward(d.input(), 1.f);
  const std::vector<float> full(P.grad() + p.offset, P.grad() + p.offset + p.numel);

  P.set_trainable(name, false);
  P.zero_grad();
  m.forward_backward(d.input(), 1.f);
  for (int64_t i = 0; i < p.numel; ++i)
    ASSERT_EQ(P.grad()[p.offset + i], 0.f) << "a frozen weight got a gradient at " << i;

  P.set_trainable(name, true);
  P.zero_grad();
  m.forward_backward(d.input(), 1.f);
  EXPECT_TRUE(loom::test::same_bits(
      full, std::vector<float>(P.grad() + p.offset, P.grad() + p.offset + p.numel)))
      << "an unfrozen weight's gradient is not the one it had";
}
