// Shared pieces of the multi-process parity tests: a tiny model, a deterministic global batch,
// and the single-process reference run that every layout must reproduce.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "model/decoder.h"
#include "optim/adamw.h"

namespace loom::testing_parallel {

inline ModelConfig tiny_model(Family f, int d_model, int n_head, int n_kv_head, int head_dim,
                              int vocab = 61) {
  ModelConfig c = model_preset(f == Family::GPT2 ? "tiny" : "tiny-llama");
  c.n_layer = 2;
  c.d_model = d_model;
  c.n_head = n_head;
  c.n_kv_head = f == Family::GPT2 ? n_head : n_kv_head;
  c.head_dim = head_dim;
  c.d_ff = f == Family::GPT2 ? 4 * d_model : 48;
  c.vocab = vocab;  // odd: with an odd width, no tensor divides evenly by the DP size
  c.max_seq = 16;
  c.init_std = 0.1f;
  return c;
}

// `rows` sequences of T tokens; sequence s of step k is the same in every layout.
struct MicroBatch {
  std::vector<int32_t> tokens, targets, positions, cu;
  int64_t valid = 0;
  ModelInput input() const {
    return {tokens.data(),
            targets.data(),
            positions.data(),
            cu.data(),
            static_cast<int>(tokens.size()),
            static_cast<int>(cu.size()) - 1};
  }
};

inline MicroBatch make_micro(int step, int first_seq, int rows, int T, int vocab) {
  MicroBatch m;
  m.cu.push_back(0);
  for (int s = first_seq; s < first_seq + rows; ++s) {
    for (int t = 0; t < T; ++t) {
      uint64_t i = (uint64_t(step) * 1000 + s) * 64 + t;
      // A learnable pattern (next = current + 1 mostly) plus noise, so the loss moves.
      int32_t tok = static_cast<int32_t>(uniform_at(7, 1, i) * vocab);
      m.tokens.push_back(tok);
      bool masked = uniform_at(7, 3, i) < 0.1;  // some positions carry no loss
      int32_t tgt = uniform_at(7, 2, i) < 0.7 ? (tok + 1) % vocab
                                              : static_cast<int32_t>(uniform_at(7, 4, i) * vocab);
      m.targets.push_back(masked ? -1 : tgt);
      m.valid += masked ? 0 : 1;
      m.positions.push_back(t);
    }
    m.cu.push_back(static_cast<int32_t>(m.tokens.size()));
  }
  return m;
}

struct StepLog {
  std::vector<double> losses, norms;
  std::vector<float> first_grads;  // reduced gradients of step 0 (before clipping)
  std::vector<float> final_params;
};

constexpr double kClip = 0.5;

// One process, `micros` micro-batches of `rows` sequences per step, global-norm clipping.
inline StepLog reference_run(const ModelConfig& cfg, int steps, int micros, int rows, int T,
                             uint64_t seed = 5) {
  Decoder m(cfg, cpu_backend());
  m.params().init(seed);
  AdamWConfig ac;
  ac.weight_decay = 0.1;
  AdamW opt(m.params(), ac, DType::F32, cpu_backend());
  StepLog log;
  ParamSet& P = m.params();
  for (int k = 0; k < steps; ++k) {
    std::vector<MicroBatch> mb;
    int64_t valid = 0;
    for (int j = 0; j < micros; ++j) {
      mb.push_back(make_micro(k, j * rows, rows, T, cfg.vocab));
      valid += mb.back().valid;
    }
    P.zero_grad();
    double loss = 0;
    for (auto& b : mb) loss += m.forward_backward(b.input(), 1.f / valid);
    double norm = std::sqrt(cpu_backend().sum_squares(P.grad(), P.total()));
    if (k == 0) log.first_grads.assign(P.grad(), P.grad() + P.total());
    float gs = norm > kClip ? static_cast<float>(kClip / norm) : 1.f;
    opt.step(1e-2, gs);
    log.losses.push_back(loss / valid);
    log.norms.push_back(norm);
  }
  log.final_params.assign(P.data(), P.data() + P.total());
  return log;
}

inline double rel_diff(double a, double b) {
  return std::fabs(a - b) / std::max(1e-30, std::max(std::fabs(a), std::fabs(b)));
}

// Asserts that this rank's gradients equal the single-process ones (`ref_grads`, laid out as
// `ref`'s parameters) at their global positions, within 1e-5 of the largest reference gradient.
// global_index(local info, reference info, local element) names the layout's mapping.
template <typename GlobalIndex>
void expect_grads_match_reference(const ParamSet& P, const ParamSet& ref,
                                  const std::vector<float>& ref_grads, GlobalIndex global_index) {
  float gmax = 0;
  for (float g : ref_grads) gmax = std::max(gmax, std::fabs(g));
  for (const ParamInfo& p : P.infos()) {
    const ParamInfo& rp = ref.info(p.name);
    for (int64_t e = 0; e < p.numel; ++e)
      ASSERT_NEAR(P.grad()[p.offset + e], ref_grads[global_index(p, rp, e)], 1e-5 * gmax)
          << p.name << " element " << e;
  }
}

}  // namespace loom::testing_parallel
