// What the guarded-trainer tests share (device_trainer_test.cpp, device_post_train_test.cpp):
// a run of three steps, an evaluation and a checkpoint, then a new Trainer that resumes from it
// and runs three more, once on the CPU backend and once on the guarded one
// (tests/kernels/guarded_backend.h: its buffers are PROT_NONE outside its ops, so a host read
// or write of device memory faults), and the comparison of the two bit for bit. Each guarded
// run happens in a child process (a death test that must exit 0), so a fault fails one test.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"
#include "kernels/guarded_backend.h"
#include "model/lora.h"
#include "same_bits.h"
#include "temp_dir.h"
#include "train/trainer.h"
#include "train/trainer_setups.h"

namespace loom::test {

struct GuardedRun {
  std::vector<double> loss, aux_loss, grad_norm, valid;
  std::vector<float> values;    // the model's weights at the end (LoRA: the base)
  std::vector<float> adapters;  // LoRA: the adapters' weights at the end
  std::vector<float> merged;    // LoRA: the model's weights after merge_into_base
  std::vector<double> extra;    // every step's mode-specific figures (DPO rewards ...)
  int64_t resumed_at = -1;
};

// The run the guarded-trainer tests start from: `preset` ("tiny", "tiny-moe") of `family` cut to
// 2 layers of 32 (Llama: one KV head), six steps of two micro-batches each (grad_accum),
// clipping on (the norm is read back), evaluation every 3 steps and a checkpoint at step 3, into
// `out`, over a fox corpus of 200 lines written in `dir`.
inline Config guarded_run_config(const std::string& dir, const std::string& family,
                                 const std::string& out, const std::string& preset = "tiny") {
  Config c = Config::parse(
      "[model]\nn_layer = 2\nd_model = 32\nn_head = 2\nmax_seq = 32\n"
      "[train]\nmicro_batch = 2\nseq_len = 16\ngrad_accum = 2\nquiet = true\nsteps = 6\n"
      "peak_gflops = 100\ncheckpoint_interval = 3\neval_interval = 3\neval_batches = 2\n"
      "clip_grad = 0.5\ntensorboard = false\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\n",
      "test.toml");
  c.set("model.preset", quoted(preset), "test");
  c.set("train.out_dir", quoted(out), "test");
  c.set("data.paths", quoted(write_fox_corpus(dir, 200)), "test");
  if (family == "llama") {
    c.set("model.family", quoted("llama"), "test");
    c.set("model.n_kv_head", "1", "test");
  }
  return c;
}

// `make(dir)` is the run's config for a run directory under `dir` (each run its own). `be` null:
// the CPU backend as train.device = cpu picks it.
template <typename MakeConfig>
GuardedRun train_and_resume(const std::string& dir, MakeConfig make, Backend* be) {
  GuardedRun r;
  const Config c = make(dir);
  auto record = [&](const StepResult& s) {
    r.loss.push_back(s.loss);
    r.aux_loss.push_back(s.aux_loss);
    r.grad_norm.push_back(s.grad_norm);
    for (const auto& [k, v] : s.extra) r.extra.push_back(v);
  };
  {
    Trainer t(c, nullptr, be);
    for (int i = 0; i < 3; ++i) record(t.train_step());
    r.valid.push_back(t.evaluate());
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  Trainer t(c, nullptr, be);
  r.resumed_at = t.step();
  for (int i = 0; i < 3; ++i) record(t.train_step());
  r.valid.push_back(t.evaluate());
  r.values = param_values(t.model().params());
  if (Lora* l = t.lora()) {
    r.adapters = param_values(l->params());
    // The merged weights an export writes (W += scale B A, a Backend GEMM on the device).
    l->merge_into_base();
    r.merged = param_values(t.model().params());
  }
  return r;
}

// What differs between the CPU run `want` and the guarded run `got` ("" when nothing), and
// whether the guarded run really went through the guarded backend `g`.
inline std::string guarded_differences(const GuardedRun& want, const GuardedRun& got,
                                       const GuardedBackend& g) {
  std::string bad;
  if (got.resumed_at != 3 || want.resumed_at != 3) bad += " (did not resume at step 3)";
  if (got.loss != want.loss) bad += " losses";
  if (got.aux_loss != want.aux_loss) bad += " aux losses";
  if (got.grad_norm != want.grad_norm) bad += " grad norms";
  if (got.valid != want.valid) bad += " validation losses";
  if (got.extra != want.extra) bad += " step figures";
  if (!loom::test::same_bits(got.values, want.values)) bad += " final weights";
  if (!loom::test::same_bits(got.adapters, want.adapters)) bad += " adapters";
  if (!loom::test::same_bits(got.merged, want.merged)) bad += " merged weights";
  for (const std::string& op :
       std::set<std::string>(g.host_pointer_ops().begin(), g.host_pointer_ops().end()))
    bad += " (host memory given to " + op + ")";
  // Six steps of two micro-batches each run hundreds of ops; a run that silently fell back on
  // the CPU backend would leave the guard idle.
  if (g.ops() < 500) bad += " (too few ops went through the guarded backend)";
  return bad;
}

// In the child: the guarded run against the CPU run; exits 0 only when they agree bit for bit
// and the steps really went through the guarded backend. `check(want)` adds what the CPU run
// itself must show (that the feature under test was on), "" when it does.
template <typename MakeConfig, typename Check>
[[noreturn]] void guarded_child(MakeConfig make, Check check) {
  // The CPU reference's bf16 GEMMs on the fp32 GEMM over widened values (as the device recipe
  // computes them), not oneDNN's, whose summation order differs.
  setenv("LOOM_BF16_GEMM", "fallback", 1);
  GuardedRun want, got;
  GuardedBackend g;
  // Every pointer an op receives must be a backend buffer (or cu_seqlens), so no host scratch
  // is handed to an op either.
  g.set_strict(true);
  try {
    TempDir a("devtrain_cpu"), b("devtrain_guarded");
    want = train_and_resume(a.str(), make, nullptr);
    got = train_and_resume(b.str(), make, &g);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run threw: %s\n", e.what());
    std::exit(2);
  }
  const std::string bad = check(want) + guarded_differences(want, got, g);
  if (!bad.empty())
    std::fprintf(stderr, "guarded trainer differs from the CPU one:%s\n", bad.c_str());
  std::exit(bad.empty() ? 0 : 1);
}

}  // namespace loom::test
