// cpu::cross_entropy_bf16 (the bf16 head's fused pass) against the passes it replaces: the
// logits rounded to bf16, cross_entropy, the gradient rounded with its bits stored; bit for bit,
// with and without gradients, with per-row weights and an ignored row; and its variant on logits
// held as bf16 bits.
#include <gtest/gtest.h>

#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/cpu_ops.h"

using namespace loom;

namespace {

constexpr int kRows = 9;

// kRows rows of V logits in [-3, 3) (counter stream `stream`), per-row weights in [-0.25, 0.75)
// (stream + 1), targets spread over the vocabulary by `stride`, row `ignored` ignored (-1).
struct CeRows {
  std::vector<float> logits, weights;
  std::vector<int32_t> targets;
};
CeRows ce_rows(int V, uint64_t stream, int stride, int ignored) {
  CeRows d{std::vector<float>(size_t(kRows) * V), std::vector<float>(kRows),
           std::vector<int32_t>(kRows)};
  for (size_t i = 0; i < d.logits.size(); ++i)
    d.logits[i] = 6.f * (uniform_at(9, stream, i) - 0.5f);
  for (int i = 0; i < kRows; ++i) {
    d.weights[size_t(i)] = uniform_at(9, stream + 1, uint64_t(i)) - 0.25f;
    d.targets[size_t(i)] = (i * stride) % V;
  }
  d.targets[size_t(ignored)] = -1;
  return d;
}

}  // namespace

TEST(CrossEntropyBf16, FusedPassEqualsRoundingAroundCrossEntropy) {
  for (int V : {97, 5000}) {
    const int N = kRows;
    const auto [logits, weights, targets] = ce_rows(V, 1, 37, 3);
    for (bool grads : {false, true}) {
      for (const float* w : std::vector<const float*>{nullptr, weights.data()}) {
        std::vector<float> ref = logits, ref_loss(N, -1.f);
        cpu::round_bf16_array(ref.data(), nullptr, ref.size());
        cpu::cross_entropy(ref_loss.data(), grads ? ref.data() : nullptr, ref.data(),
                           targets.data(), N, V, 0.125f, w);
        std::vector<uint16_t> ref_bits(ref.size());
        if (grads) cpu::round_bf16_array(ref.data(), ref_bits.data(), ref.size());

        std::vector<float> got = logits, loss(N, -1.f);
        std::vector<uint16_t> bits(ref.size(), 0xabcd);
        cpu::cross_entropy_bf16(loss.data(), got.data(), bits.data(), targets.data(), N, V, 0.125f,
                                w, grads);
        for (int i = 0; i < N; ++i)
          ASSERT_EQ(f32_bits(loss[size_t(i)]), f32_bits(ref_loss[size_t(i)])) << "row " << i;
        for (size_t i = 0; i < ref.size(); ++i) {
          // Without gradients the logits are left rounded (as the Decoder's pass left them).
          ASSERT_EQ(f32_bits(got[i]), f32_bits(ref[i]))
              << "V " << V << " grads " << grads << " " << i;
          ASSERT_EQ(bits[i], grads ? ref_bits[i] : uint16_t{0xabcd}) << i;
        }
        EXPECT_GT(loss[0], 0.f);
        EXPECT_EQ(loss[3], 0.f);
      }
    }
  }
}

// cpu::cross_entropy_from_bf16 (the head whose GEMM wrote bf16 logits) against the fused fp32
// pass on the same values widened: the same losses and, with gradients, the same gradient bits
// written over the logits' bits in place; without gradients the logits are left as they were.
TEST(CrossEntropyBf16, FromBf16BitsEqualsFusedPassOnWidenedLogits) {
  for (int V : {97, 5000}) {
    const int N = kRows;
    const auto [fp32_logits, weights, targets] = ce_rows(V, 3, 41, 5);
    std::vector<uint16_t> logits(fp32_logits.size());
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = f32_to_bf16(fp32_logits[i]);
    for (bool grads : {false, true}) {
      for (const float* w : std::vector<const float*>{nullptr, weights.data()}) {
        std::vector<float> ref(logits.size()), ref_loss(N, -1.f);
        cpu::bf16_to_f32_array(logits.data(), ref.data(), ref.size());
        std::vector<uint16_t> ref_bits(ref.size());
        cpu::cross_entropy_bf16(ref_loss.data(), ref.data(), ref_bits.data(), targets.data(), N, V,
                                0.125f, w, grads);

        std::vector<uint16_t> got = logits;
        std::vector<float> loss(N, -1.f);
        cpu::cross_entropy_from_bf16(loss.data(), got.data(), targets.data(), N, V, 0.125f, w,
                                     grads);
        for (int i = 0; i < N; ++i)
          ASSERT_EQ(f32_bits(loss[size_t(i)]), f32_bits(ref_loss[size_t(i)])) << "row " << i;
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], grads ? ref_bits[i] : logits[i])
              << "V " << V << " grads " << grads << " " << i;
        EXPECT_GT(loss[0], 0.f);
        EXPECT_EQ(loss[5], 0.f);
      }
    }
  }
}
