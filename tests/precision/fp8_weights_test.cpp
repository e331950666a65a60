// The CPU fp8 recipes on the bf16 policy's 2-byte weights (drop_fp32_weights): W quantised from
// the set's bf16 copy, dy from the bf16 bits the decoder leaves (GemmRecipe::dy_bits), x from
// its bf16 storage, a zeroed dW written rather than accumulated. Each must give the bits of the
// fp32 reads: a model whose weights keep their fp32 values, and one whose activations are
// stored as fp32 (so x and dy reach the recipe as fp32), train bit-identically to it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "kernels/cpu/gemm_bf16.h"
#include "model/decoder.h"
#include "model/small_bf16_models.h"
#include "optim/adamw.h"
#include "precision/bf16_gemms.h"
#include "precision/fp8_recipes.h"

using namespace loom;
using namespace loom::test;

namespace {

struct Fp8Run {
  std::unique_ptr<Decoder> model;
  std::unique_ptr<AdamW> optim;
  std::unique_ptr<Bf16Gemms> bf16;
  std::unique_ptr<Fp8Recipes> fp8;
};

Fp8Run make_run(Family f, Fp8RecipeKind k, bool drop, bool fp32_acts) {
  Fp8Run r;
  r.model =
      std::make_unique<Decoder>(small_bf16_model(f), cpu_backend(), Recompute::None, DType::BF16);
  if (fp32_acts) r.model->store_activations_as_fp32();
  r.model->params().init(5);
  round_to(DType::BF16, r.model->params().data(), size_t(r.model->params().total()));
  r.optim = std::make_unique<AdamW>(r.model->params(), AdamWConfig{}, DType::BF16, cpu_backend());
  r.bf16 = attach_bf16_gemms(*r.model, true);
  Fp8Options o;
  o.kind = k;
  o.hybrid = k != Fp8RecipeKind::Mxfp8;
  r.fp8 = attach_fp8_recipes(o, *r.model, true);
  if (drop) drop_fp32_weights(*r.model);
  return r;
}

}  // namespace

TEST(Fp8Weights, TwoByteWeightsAndBf16InputsTrainBitIdentically) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn)
    GTEST_SKIP() << "no AVX512-BF16 here: no 2-byte weights";
  for (Family f : {Family::GPT2, Family::Llama})
    for (Fp8RecipeKind k : {Fp8RecipeKind::TensorwiseCurrent, Fp8RecipeKind::TensorwiseDelayed,
                            Fp8RecipeKind::Mxfp8}) {
      SCOPED_TRACE(testing::Message()
                   << (f == Family::GPT2 ? "gpt2 " : "llama ") << fp8_recipe_name(k));
      Fp8Run ref = make_run(f, k, /*drop=*/false, /*fp32_acts=*/true);
      Fp8Run kept = make_run(f, k, false, false), drop = make_run(f, k, true, false);
      const SmallBatch d = small_batch(2, 24, 11);
      const int64_t n = ref.model->params().total();
      for (int s = 0; s < 3; ++s) {
        double ref_loss = 0;
        for (Fp8Run* r : {&ref, &kept, &drop}) {
          r->bf16->new_weights();
          r->fp8->begin_step();
          r->model->params().zero_grad();
          // Two micro-batches: the second accumulates onto the first's dW.
          double loss = r->model->forward_backward(d.input(), 1.f / 96);
          loss += r->model->forward_backward(d.input(), 1.f / 96);
          if (r == &ref) ref_loss = loss;
          ASSERT_EQ(loss, ref_loss) << "step " << s;
          ASSERT_EQ(
              0, std::memcmp(r->model->params().grad(), ref.model->params().grad(), 4 * size_t(n)))
              << "step " << s;
          r->optim->step(1e-2, 1.f);
        }
      }
      EXPECT_EQ(0, std::memcmp(kept.optim->master(), ref.optim->master(), 4 * size_t(n)));
      EXPECT_EQ(0, std::memcmp(drop.optim->master(), ref.optim->master(), 4 * size_t(n)));
      EXPECT_TRUE(drop.model->params().any_fp32_dropped());
    }
}

// Lazy gradient zeroing (model/grad_zeroing.h) covers the fp8 linears' weight gradients, which
// their wgrad GEMM writes whole after each zero_grad(): zero_grad() leaves them (pending, the
// last step's values still there), and the step's gradients equal those of a step after a full
// fill (zero_grad, then settle_grads: every pending range filled with zeros), bit for bit.
TEST(Fp8Weights, LazilyZeroedWeightGradientsEqualFullyZeroedOnes) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn)
    GTEST_SKIP() << "no AVX512-BF16 here: no 2-byte weights";
  for (Fp8RecipeKind k :
       {Fp8RecipeKind::TensorwiseCurrent, Fp8RecipeKind::TensorwiseDelayed, Fp8RecipeKind::Mxfp8}) {
    SCOPED_TRACE(fp8_recipe_name(k));
    Fp8Run lazy = make_run(Family::GPT2, k, true, false),
           full = make_run(Family::GPT2, k, true, false);
    const SmallBatch d1 = small_batch(2, 24, 12), d2 = small_batch(2, 24, 13);
    const ParamSet& P = lazy.model->params();
    const ParamInfo& w = P.info(lazy.fp8->names().front() + ".weight");
    double loss[2];
    for (Fp8Run* r : {&lazy, &full}) {
      ParamSet& Q = r->model->params();
      r->fp8->begin_step();
      Q.zero_grad();
      r->model->forward_backward(d1.input(), 1.f / 48);
      r->optim->step(1e-2, 1.f);
      r->fp8->begin_step();
      Q.zero_grad();
      if (r == &full) Q.settle_grads();
      loss[r == &full] = r->model->forward_backward(d2.input(), 1.f / 48);
    }
    EXPECT_EQ(loss[0], loss[1]);
    EXPECT_EQ(0, std::memcmp(P.grad(), full.model->params().grad(), 4 * size_t(P.total())));
    // and the fill was skipped: after another zero_grad the fp8 weight's gradient is pending
    lazy.model->params().zero_grad();
    EXPECT_TRUE(P.grads_pending(w.offset, w.offset + w.numel));
    bool stale = false;
    for (int64_t i = 0; i < w.numel && !stale; ++i) stale = P.grad()[w.offset + i] != 0.f;
    EXPECT_TRUE(stale);
  }
}
