// What the model tests share: a tiny model of either family, and packed micro-batches.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/decoder.h"

namespace loom::test {

// Two layers, width 16, 4 heads (GQA 4/2 for Llama), vocabulary 32, context 16; large weights
// so every path carries a gradient well above fp32 noise.
inline ModelConfig tiny(Family f) {
  ModelConfig c = model_preset(f == Family::GPT2 ? "tiny" : "tiny-llama");
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = f == Family::GPT2 ? 4 : 2;
  c.head_dim = 4;
  c.d_ff = f == Family::GPT2 ? 64 : 24;
  c.vocab = 32;
  c.max_seq = 16;
  c.init_std = 0.2f;
  return c;
}

// A packed micro-batch: sequences end to end with cu_seqlens between them, and optional
// per-token loss weights.
struct Data {
  std::vector<int32_t> tokens, targets, positions, cu;
  std::vector<float> weights;
  float logit_scale = 1.f;
  ModelInput input() const {
    ModelInput in{tokens.data(),
                  targets.data(),
                  positions.data(),
                  cu.data(),
                  static_cast<int>(tokens.size()),
                  static_cast<int>(cu.size()) - 1};
    in.loss_weights = weights.empty() ? nullptr : weights.data();
    in.logit_scale = logit_scale;
    return in;
  }
};

// Sequences of the given lengths with random tokens and random targets.
inline Data make_data(const std::vector<int>& lens, int vocab, uint64_t seed) {
  Data d;
  d.cu.push_back(0);
  for (int len : lens) {
    for (int t = 0; t < len; ++t) {
      const size_t i = d.tokens.size();
      d.tokens.push_back(static_cast<int32_t>(uniform_at(seed, 1, i) * vocab));
      d.targets.push_back(static_cast<int32_t>(uniform_at(seed, 2, i) * vocab));
      d.positions.push_back(t);
    }
    d.cu.push_back(static_cast<int32_t>(d.tokens.size()));
  }
  return d;
}

// The analytic gradient `g` (indexed like P's elements) of 3 elements of every parameter of P
// (first, middle, last) against central differences of m's loss on `d` (eps 1e-2, within 2%
// + 2e-3); returns how many were checked. `what` names the case in a failure; `only`, when
// given, names the one parameter to check.
inline int expect_gradients_match_differences(Decoder& m, ParamSet& P, const Data& d,
                                              const std::vector<float>& g, const std::string& what,
                                              const std::string& only = "") {
  const float eps = 1e-2f;
  int checked = 0;
  for (const ParamInfo& p : P.infos())
    for (int k = 0; k < 3 && (only.empty() || p.name == only); ++k) {
      const int64_t i = p.offset + (p.numel - 1) * k / 2;
      const float saved = P.data()[i];
      P.data()[i] = saved + eps;
      const double lp = m.forward_loss(d.input());
      P.data()[i] = saved - eps;
      const double lm = m.forward_loss(d.input());
      P.data()[i] = saved;
      const double numeric = (lp - lm) / (2 * eps), a = g[size_t(i)];
      EXPECT_NEAR(a, numeric, 2e-2 * std::max(std::fabs(a), std::fabs(numeric)) + 2e-3)
          << p.name << " " << what;
      ++checked;
    }
  return checked;
}

// A GEMM recipe that delegates to the backend and counts its calls: whether a linear's recipe
// is in place, and how often it runs.
struct CountingRecipe : GemmRecipe {
  int forwards = 0, backwards = 0;
  std::vector<float> x32;
  void forward(Backend& be, float* y, ActIn x, const float* w, const float* b, int N, int in,
               int out) override {
    ++forwards;
    be.matmul_forward(y, x.widened(be, int64_t(N) * in, x32), w, b, N, in, out);
  }
  void backward(Backend& be, float* dx, float* dw, float* db, const float* dy, ActIn x,
                const float* w, int N, int in, int out) override {
    ++backwards;
    be.matmul_backward(dx, dw, db, dy, x.widened(be, int64_t(N) * in, x32), w, N, in, out);
  }
};

}  // namespace loom::test
