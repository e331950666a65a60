// What the 2-rank device layout tests share (tests/train/device_parallel_test.cpp,
// tests/precision/fp8_device_parallel_test.cpp): a parallel layout of the tiny trainer, its run
// of three steps, an evaluation and a checkpoint, then a new trainer that resumes and trains
// three more over the guarded CPU backend (tests/kernels/guarded_backend.h), against six straight
// steps of the same layout on the plain CPU trainer, compared bit for bit: losses, gradient
// norms, validation losses and this rank's final weights.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "kernels/guarded_backend.h"
#include "parallel/trainer_fixture.h"
#include "same_bits.h"
#include "train/trainer.h"

namespace loom::testing_parallel {

struct Layout {
  const char* name;
  const char* preset;
  std::vector<std::pair<std::string, std::string>> keys;
  int grad_accum = 2;
  const char* precision = "fp32";
  int n_layer = 2;  // (4 for two pipeline ranks of two virtual stages each)
};

// The layout's run config in `dir`: six steps, an evaluation and a checkpoint every three.
inline Config layout_config(const TrainerRuns& runs, const std::string& dir, const Layout& l) {
  Config c = tiny_run_config(dir, runs.line_start, l.n_layer, "5e-3", 6, l.grad_accum);
  c.set("model.preset", std::string("\"") + l.preset + "\"", "test");
  c.set("train.eval_interval", "3", "test");
  c.set("train.eval_batches", "2", "test");
  c.set("train.checkpoint_interval", "3", "test");
  c.set("train.tensorboard", "false", "test");
  c.set("precision.policy", std::string("\"") + l.precision + "\"", "test");
  for (const auto& [k, v] : l.keys) c.set(k, v, "test");
  return c;
}

struct LayoutRun {
  std::vector<double> loss, grad_norm, valid;
  std::vector<float> values;  // this rank's weights at the end
  int64_t resumed_at = -1;
};

// Three steps, then an evaluation.
inline void record_steps(LayoutRun& r, Trainer& t) {
  for (int i = 0; i < 3; ++i) {
    const StepResult s = t.train_step();
    r.loss.push_back(s.loss);
    r.grad_norm.push_back(s.grad_norm);
  }
  r.valid.push_back(t.evaluate());
}

inline std::vector<float> rank_weights(Trainer& t) {
  const ParamSet& P = t.model().params();
  std::vector<float> v(size_t(P.total()));
  P.read_values(0, P.total(), v.data());
  return v;
}

// The plain CPU trainer, six steps straight (evaluating after steps 3 and 6).
inline LayoutRun cpu_layout_run(const Config& c) {
  LayoutRun r;
  Trainer t(c);
  record_steps(r, t);
  record_steps(r, t);
  r.values = rank_weights(t);
  return r;
}

// The trainer over `g`: three steps and a checkpoint, then a new trainer resumes for three more.
inline LayoutRun guarded_layout_run(const Config& c, test::GuardedBackend& g) {
  LayoutRun r;
  {
    Trainer t(c, nullptr, &g);
    record_steps(r, t);
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  Trainer t(c, nullptr, &g);
  r.resumed_at = t.step();
  record_steps(r, t);
  r.values = rank_weights(t);
  return r;
}

// The CPU reference's bf16 GEMMs on the fp32 GEMM over widened values, as the device path
// computes them (oneDNN's summation order differs). Call before either run.
inline void use_fallback_bf16_gemm() {
  setenv("LOOM_BF16_GEMM", "fallback", 1);
}

// `got` (the guarded run) equals `want` (the CPU run) bit for bit, no host memory reached an op
// of `g`, and at least `min_ops` ops went through it (a run that fell back on the CPU backend
// would leave the guard idle); the model trained (its losses moved).
inline void expect_same_run(const LayoutRun& want, const LayoutRun& got,
                            const test::GuardedBackend& g, int64_t min_ops) {
  EXPECT_EQ(got.resumed_at, 3);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.grad_norm, want.grad_norm);
  EXPECT_EQ(got.valid, want.valid);
  EXPECT_TRUE(test::same_bits(got.values, want.values))
      << "final weights differ on rank " << W().rank();
  for (const std::string& op :
       std::set<std::string>(g.host_pointer_ops().begin(), g.host_pointer_ops().end()))
    ADD_FAILURE() << "host memory given to " << op;
  EXPECT_GT(g.ops(), min_ops);
  EXPECT_NE(want.loss.front(), want.loss.back()) << "the model did not train";
}

}  // namespace loom::testing_parallel
