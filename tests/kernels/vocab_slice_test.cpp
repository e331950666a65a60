// The Backend's vocabulary-slice ops (tensor parallelism): the slices of a vocabulary, combined
// as parallel/vocab_parallel.cpp combines them across ranks (sums, and the max then the sums of
// the cross-entropy's statistics), give what the whole-vocabulary ops give.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "kernels/grad_check.h"

using namespace loom;

namespace {
constexpr int kSlices = 3;
}

TEST(VocabSlice, EmbeddingSlicesSumToTheLookupAndItsGradient) {
  Backend& be = cpu_backend();
  const int V = 12, C = 40, N = 33, Vl = V / kSlices;
  auto table = test::random_floats(size_t(V) * C, 1);
  auto ids = test::random_ints(N, 2, 0, V - 1);
  auto dout = test::random_floats(size_t(N) * C, 3);
  std::vector<float> want(size_t(N) * C), sum(size_t(N) * C, 0.f), part(size_t(N) * C, 7.f);
  be.embedding_forward(want.data(), ids.data(), table.data(), N, C, false);
  std::vector<float> dwant(size_t(V) * C, 0.f), dgot(size_t(V) * C, 0.f);
  be.embedding_backward(dwant.data(), dout.data(), ids.data(), N, C);
  for (int s = 0; s < kSlices; ++s) {
    const int v0 = s * Vl;
    // The slice's rows of the table, as a rank holds them.
    const float* slice = table.data() + size_t(v0) * C;
    be.embedding_forward_slice(part.data(), ids.data(), slice, N, C, v0, Vl);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    be.embedding_backward_slice(dgot.data() + size_t(v0) * C, dout.data(), ids.data(), N, C, v0,
                                Vl);
  }
  EXPECT_EQ(sum, want);    // one slice holds each row; the others add zeros
  EXPECT_EQ(dgot, dwant);  // each table row gets its tokens' rows, in the same order
}

TEST(VocabSlice, CrossEntropySlicesEqualTheWholeVocabulary) {
  Backend& be = cpu_backend();
  const int V = 30, N = 7, Vl = V / kSlices;
  auto logits = test::random_floats(size_t(N) * V, 4, -5, 5);
  std::vector<int32_t> targets = {0, 29, -1, 10, 9, 20, 15};
  std::vector<float> weights = {1.f, 0.5f, 1.f, -2.f, 0.f, 1.f, 3.f};
  const float dloss = 0.25f;
  std::vector<float> want_loss(N), want_grad(size_t(N) * V);
  be.cross_entropy(want_loss.data(), want_grad.data(), logits.data(), targets.data(), N, V, dloss,
                   weights.data());
  // Each slice's [N, Vl] logits, as a rank holds them.
  std::vector<std::vector<float>> part(kSlices, std::vector<float>(size_t(N) * Vl));
  for (int s = 0; s < kSlices; ++s)
    for (int i = 0; i < N; ++i)
      std::copy_n(logits.data() + size_t(i) * V + s * Vl, Vl, part[s].data() + size_t(i) * Vl);
  // The collectives by hand: max over slices, then sums.
  std::vector<float> mx(N, -INFINITY), m(N), se(N, 0.f), tl(N, 0.f), se_s(N), tl_s(N);
  for (int s = 0; s < kSlices; ++s) {
    be.cross_entropy_slice_max(m.data(), part[s].data(), N, Vl);
    for (int i = 0; i < N; ++i) mx[i] = std::max(mx[i], m[i]);
  }
  for (int s = 0; s < kSlices; ++s) {
    be.cross_entropy_slice_sums(se_s.data(), tl_s.data(), part[s].data(), mx.data(), targets.data(),
                                N, Vl, s * Vl);
    for (int i = 0; i < N; ++i) se[i] += se_s[i], tl[i] += tl_s[i];
  }
  for (int s = 0; s < kSlices; ++s) {
    std::vector<float> loss(N, 9.f);
    be.cross_entropy_slice_finish(loss.data(), part[s].data(), part[s].data(), mx.data(), se.data(),
                                  tl.data(), targets.data(), N, Vl, s * Vl, dloss, weights.data());
    for (int i = 0; i < N; ++i) {
      EXPECT_NEAR(loss[i], want_loss[i], 1e-5) << "row " << i << " slice " << s;
      for (int j = 0; j < Vl; ++j)
        EXPECT_NEAR(part[s][size_t(i) * Vl + j], want_grad[size_t(i) * V + s * Vl + j], 1e-6)
            << "row " << i << " column " << s * Vl + j;
    }
  }
}

TEST(VocabSlice, Copy2dInterleavesSlicesIntoRows) {
  Backend& be = cpu_backend();
  const int n = 4, Vl = 5, T = 3, V = Vl * T;
  std::vector<float> parts(size_t(n) * V), rows(size_t(n) * V, -1.f);
  for (size_t i = 0; i < parts.size(); ++i) parts[i] = float(i);
  for (int r = 0; r < T; ++r)
    be.copy_2d(rows.data() + r * Vl, V * sizeof(float), parts.data() + size_t(r) * n * Vl,
               Vl * sizeof(float), Vl * sizeof(float), n);
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < T; ++r)
      for (int j = 0; j < Vl; ++j)
        EXPECT_EQ(rows[size_t(i) * V + r * Vl + j], parts[size_t(r) * n * Vl + i * Vl + j]);
}
