// Whole steps of the real Decoder on any Backend, checked against the same Decoder on the CPU
// backend: the loss, every parameter's gradient, StepOutputs::seq_logprobs, forward_loss and
// forward_logits of chosen rows, with per-token loss weights and frozen parameters; and a few
// AdamW steps (Backend::adamw over the whole parameter buffer) whose loss curve must track the
// CPU's. The bodies take a Backend, so the same checks run here over the CPU backend (tests/
// model/backend_step_test.cpp, where they must agree bit for bit) and on a GPU over CudaBackend
// (tests/cuda/cuda_step_test.cpp, with the tolerances stated there).
//
// Everything the host sees of the device run goes through the Backend's staging (read_grads,
// copy_d2h): nothing here dereferences a device pointer, which the guarded-backend test checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "model/decoder.h"
#include "model/model_test_util.h"

namespace loom::test {

// How close the device run must be to the CPU run. Gradients and logits are compared element
// by element against the largest magnitude of the CPU tensor (GEMM-like sums: the error scales
// with the tensor, not the element); losses and log-probabilities relative to the value.
struct StepTol {
  double loss_rel = 0;     // loss sum and forward_loss
  double grad_rel = 0;     // per parameter, times its largest |gradient|
  double logits_rel = 0;   // forward_logits, times the largest |logit|
  double logprob_rel = 0;  // seq_logprobs, times max(1, |value|); token_logprobs, times the
                           // largest |value|
};

struct StepSpec {
  ModelConfig cfg;
  std::vector<int> lens;  // the micro-batch's sequence lengths (packed)
  Recompute recompute = Recompute::None;
  DType act = DType::F32;
  bool loss_weights = false;        // per-token weights with zeros and negative values
  std::vector<std::string> frozen;  // parameters frozen on both sides
  // false: the frozen list's gradients get the sentinel but stay trainable (so the step writes
  // them): how the tests show that a written frozen gradient is caught.
  bool freeze = true;
  uint64_t seed = 4;
};

// What a run produced, staged to the host.
struct StepRun {
  double loss = 0, fwd_loss = 0;
  std::vector<float> grads;  // the whole gradient buffer
  std::vector<ParamInfo> infos;
  StepOutputs out;
  std::vector<int> rows;
  std::vector<float> logits;  // [rows, vocab]
  // Frozen parameters whose gradient buffer changed during the step (must stay empty).
  std::vector<std::string> frozen_written;
};

// The spec's micro-batch: random tokens and targets, every 7th target ignored, and (when asked)
// loss weights of 0, -0.5 and 2 on some tokens.
inline Data step_data(const StepSpec& s) {
  Data d = make_data(s.lens, s.cfg.vocab, s.seed + 100);
  for (size_t i = 0; i < d.targets.size(); i += 7) d.targets[i] = -1;
  if (s.loss_weights) {
    d.weights.assign(d.tokens.size(), 1.f);
    for (size_t i = 1; i < d.weights.size(); i += 5) d.weights[i] = 0.f;
    for (size_t i = 3; i < d.weights.size(); i += 11) d.weights[i] = -0.5f;
    for (size_t i = 2; i < d.weights.size(); i += 13) d.weights[i] = 2.f;
  }
  return d;
}

// Frozen gradients are filled with this byte: 0x01010101 is a tiny normal float (2.4e-38),
// so any accumulation into it (even of a gradient of 1e-40) changes its bits.
constexpr int kSentinelByte = 0x01;

// One forward_backward (dloss = 1/N), then forward_loss and forward_logits on the same input,
// through a Decoder on `be`. Frozen parameters' gradients are filled with a sentinel first (on
// the device, by fill_bytes), so a write to them shows.
inline StepRun run_step(Backend& be, const StepSpec& s) {
  const Data d = step_data(s);
  const ModelInput in = d.input();
  Decoder m(s.cfg, be, s.recompute, s.act);
  m.params().init(s.seed);
  m.params().zero_grad();
  ParamSet& P = m.params();
  for (const std::string& n : s.frozen) {
    if (s.freeze) P.set_trainable(n, false);
    const ParamInfo& p = P.info(n);
    be.fill_bytes(P.grad() + p.offset, kSentinelByte, size_t(p.numel) * sizeof(float));
  }
  StepRun r;
  r.infos = P.infos();
  r.out.want_token_logprobs = true;
  r.loss = m.forward_backward(in, 1.f / float(in.N), &r.out);
  r.grads.resize(size_t(P.total()));
  P.read_grads(0, P.total(), r.grads.data());
  for (const std::string& n : s.frozen) {
    const ParamInfo& p = P.info(n);
    for (int64_t i = 0; i < p.numel; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &r.grads[size_t(p.offset + i)], 4);
      if (bits != 0x01010101u) {
        r.frozen_written.push_back(n);
        break;
      }
    }
  }
  r.fwd_loss = m.forward_loss(in);
  // The last token, the first, one inside each later sequence, and a repeat.
  r.rows = {in.N - 1, 0};
  for (int q = 1; q < in.nseq; ++q)
    r.rows.push_back(in.cu_seqlens[q] + 1 < in.N ? in.cu_seqlens[q] + 1 : 0);
  r.rows.push_back(in.N - 1);
  r.logits.resize(r.rows.size() * size_t(s.cfg.vocab));
  m.forward_logits(in, r.rows, r.logits.data());
  return r;
}

// |got - want| <= rel * scale element by element (scale: the largest finite |want|, at least
// 1e-30); NaN passes only against NaN. Names the worst element.
inline ::testing::AssertionResult close_to_scale(const float* got, const float* want, size_t n,
                                                 double rel, const std::string& what) {
  double m = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(want[i])) m = std::max(m, double(std::fabs(want[i])));
  const double tol = rel * std::max(m, 1e-30);
  size_t bad = 0, worst = 0;
  double worst_err = -1;
  for (size_t i = 0; i < n; ++i) {
    const bool gn = std::isnan(got[i]), wn = std::isnan(want[i]);
    const double err = gn || wn ? (gn && wn ? 0.0 : INFINITY) : std::fabs(double(got[i]) - want[i]);
    if (err > tol) ++bad;
    if (err > worst_err) {
      worst_err = err;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << n << " elements differ by more than " << rel << " x "
         << m << "; worst at " << worst << ": " << got[worst] << " vs " << want[worst];
}

inline bool close_rel(double got, double want, double rel) {
  return std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));
}

// Every check of a device run against the CPU run, in one result naming each disagreement.
inline ::testing::AssertionResult steps_agree(const StepRun& dev, const StepRun& cpu,
                                              const StepTol& t) {
  std::ostringstream bad;
  auto num = [&](const char* what, double g, double w, double rel) {
    if (!close_rel(g, w, rel))
      bad << "\n  " << what << ": " << g << " vs " << w << " (rel " << rel << ")";
  };
  num("loss", dev.loss, cpu.loss, t.loss_rel);
  num("forward_loss", dev.fwd_loss, cpu.fwd_loss, t.loss_rel);
  if (dev.grads.size() != cpu.grads.size()) {
    bad << "\n  gradient buffers of " << dev.grads.size() << " vs " << cpu.grads.size();
  } else {
    for (const ParamInfo& p : cpu.infos) {
      if (!p.trainable) continue;
      auto r = close_to_scale(dev.grads.data() + p.offset, cpu.grads.data() + p.offset,
                              size_t(p.numel), t.grad_rel, "gradient of " + p.name);
      if (!r) bad << "\n  " << r.message();
    }
  }
  for (const std::string& n : dev.frozen_written)
    bad << "\n  frozen " << n << "'s gradient written";
  if (dev.out.seq_logprobs.size() != cpu.out.seq_logprobs.size()) {
    bad << "\n  " << dev.out.seq_logprobs.size() << " seq_logprobs vs "
        << cpu.out.seq_logprobs.size();
  } else {
    for (size_t s = 0; s < cpu.out.seq_logprobs.size(); ++s)
      num(("seq_logprobs[" + std::to_string(s) + "]").c_str(), dev.out.seq_logprobs[s],
          cpu.out.seq_logprobs[s], t.logprob_rel);
  }
  if (dev.out.token_logprobs.size() != cpu.out.token_logprobs.size()) {
    bad << "\n  " << dev.out.token_logprobs.size() << " token_logprobs vs "
        << cpu.out.token_logprobs.size();
  } else {
    auto r = close_to_scale(dev.out.token_logprobs.data(), cpu.out.token_logprobs.data(),
                            cpu.out.token_logprobs.size(), t.logprob_rel, "token_logprobs");
    if (!r) bad << "\n  " << r.message();
  }
  if (dev.logits.size() != cpu.logits.size()) {
    bad << "\n  " << dev.logits.size() << " logits vs " << cpu.logits.size();
  } else {
    auto r = close_to_scale(dev.logits.data(), cpu.logits.data(), cpu.logits.size(), t.logits_rel,
                            "forward_logits");
    if (!r) bad << "\n  " << r.message();
  }
  if (bad.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "device run differs from the CPU run:" << bad.str();
}

// The CPU reference of a spec: the same model and data with no recomputation (every mode gives
// bit-identical gradients on the CPU, which the model tests check).
inline StepRun cpu_reference(StepSpec s) {
  s.recompute = Recompute::None;
  return run_step(cpu_backend(), s);
}

// What a caller attaches to the model of train_curve (a GEMM recipe) and does before each step
// (the recipe's begin_step). Both optional.
struct CurveHooks {
  std::function<void(Decoder&)> setup;
  std::function<void(int step)> before_step;
};

// `steps` AdamW steps on one fixed micro-batch through a Decoder on `be`: forward_backward, then
// Backend::adamw over the whole parameter buffer with its moments in buffers of the same
// backend (lr 3e-3, betas 0.9 / 0.95, no weight decay). Returns each step's mean loss.
inline std::vector<double> train_curve(Backend& be, const StepSpec& s, int steps,
                                       const CurveHooks& hooks = {}) {
  const Data d = step_data(s);
  const ModelInput in = d.input();
  Decoder m(s.cfg, be, s.recompute, s.act);
  m.params().init(s.seed);
  if (hooks.setup) hooks.setup(m);
  const int64_t P = m.params().total();
  BackendBuffer mom = BackendBuffer::zeroed(be, size_t(P) * sizeof(float), "optimizer");
  BackendBuffer var = BackendBuffer::zeroed(be, size_t(P) * sizeof(float), "optimizer");
  std::vector<double> curve;
  for (int step = 1; step <= steps; ++step) {
    if (hooks.before_step) hooks.before_step(step);
    m.params().zero_grad();
    curve.push_back(m.forward_backward(in, 1.f / float(in.N)) / in.N);
    be.adamw(m.params().data(), m.params().grad(), mom.as<float>(), var.as<float>(), P, 3e-3f, 0.9f,
             0.95f, 1e-8f, 0.f, 1.f, step);
  }
  return curve;
}

// Two curves agree within `rel` of the reference at every step, and the reference falls (so
// the steps did train).
inline ::testing::AssertionResult curves_agree(const std::vector<double>& dev,
                                               const std::vector<double>& cpu, double rel) {
  if (dev.size() != cpu.size() || cpu.size() < 2)
    return ::testing::AssertionFailure() << "curves of " << dev.size() << " and " << cpu.size();
  std::ostringstream bad;
  for (size_t i = 0; i < cpu.size(); ++i)
    if (!(std::fabs(dev[i] - cpu[i]) <= rel * std::fabs(cpu[i])))
      bad << "\n  step " << i + 1 << ": " << dev[i] << " vs " << cpu[i];
  if (!(cpu.back() < cpu.front())) bad << "\n  the CPU loss did not fall";
  if (bad.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "loss curves differ (rel " << rel << "):" << bad.str();
}

}  // namespace loom::test
