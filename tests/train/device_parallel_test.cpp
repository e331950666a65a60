// Every parallel layout of the trainer on a device, proven on 2 MPI ranks without a GPU: each rank
// trains over the guarded CPU backend (tests/kernels/guarded_backend.h: its buffers are PROT_NONE
// outside its ops, so a host read or write of device memory faults and ends the job), its groups
// exchanging device memory through the staged communicator (comm/staged_communicator.h, which is
// what parallel.device_comm = "auto" gives without NCCL). Per layout -- TP, TP with SP (bf16
// activations gathered), PP with virtual stages (interleaved), CP (the ring), EP (the MoE
// all-to-all) -- three steps, an evaluation and a checkpoint, then a new trainer that resumes and
// trains three more, must equal six straight steps of the same layout on the plain CPU trainer bit
// for bit (losses, gradient norms, validation losses, this rank's final weights). The ops are the
// CPU's, so any difference is a host round trip done wrong (or a resume that is not exact).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/guarded_backend.h"
#include "mpi_main.h"
#include "parallel/trainer_fixture.h"
#include "train/trainer.h"

using namespace loom;
using loom::testing_parallel::W;

namespace {

const testing_parallel::TrainerRuns runs{"devpar", "a parallel device fox "};

struct Layout {
  const char* name;
  const char* preset;
  std::vector<std::pair<std::string, std::string>> keys;
  int grad_accum = 2;
  const char* precision = "fp32";
  int n_layer = 2;  // (4 for two pipeline ranks of two virtual stages each)
};

Config config(const std::string& dir, const Layout& l) {
  Config c =
      testing_parallel::tiny_run_config(dir, runs.line_start, l.n_layer, "5e-3", 6, l.grad_accum);
  c.set("model.preset", std::string("\"") + l.preset + "\"", "test");
  c.set("train.eval_interval", "3", "test");
  c.set("train.eval_batches", "2", "test");
  c.set("train.checkpoint_interval", "3", "test");
  c.set("train.tensorboard", "false", "test");
  c.set("precision.policy", std::string("\"") + l.precision + "\"", "test");
  for (const auto& [k, v] : l.keys) c.set(k, v, "test");
  return c;
}

struct Run {
  std::vector<double> loss, grad_norm, valid;
  std::vector<float> values;
  int64_t resumed_at = -1;
};

void record(Run& r, Trainer& t, int steps) {
  for (int i = 0; i < steps; ++i) {
    const StepResult s = t.train_step();
    r.loss.push_back(s.loss);
    r.grad_norm.push_back(s.grad_norm);
  }
  r.valid.push_back(t.evaluate());
}

void read_weights(Run& r, Trainer& t) {
  const ParamSet& P = t.model().params();
  r.values.resize(size_t(P.total()));
  P.read_values(0, P.total(), r.values.data());
}

// The plain CPU trainer, six steps straight (evaluating after steps 3 and 6).
Run cpu_run(const Layout& l) {
  Run r;
  Trainer t(config(runs.dir(std::string(l.name) + "_cpu"), l));
  record(r, t, 3);
  record(r, t, 3);
  read_weights(r, t);
  return r;
}

// The guarded trainer: three steps and a checkpoint, then a new trainer resumes for three more.
Run guarded_run(const Layout& l, test::GuardedBackend& g) {
  Run r;
  const Config c = config(runs.dir(std::string(l.name) + "_dev"), l);
  {
    Trainer t(c, nullptr, &g);
    record(r, t, 3);
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  Trainer t(c, nullptr, &g);
  r.resumed_at = t.step();
  record(r, t, 3);
  read_weights(r, t);
  return r;
}

void expect_layout_matches(const Layout& l) {
  SCOPED_TRACE(l.name);
  // The CPU reference's bf16 GEMMs on the fp32 GEMM over widened values, as the device recipe
  // computes them (oneDNN's summation order differs).
  setenv("LOOM_BF16_GEMM", "fallback", 1);
  const Run want = cpu_run(l);
  test::GuardedBackend g;
  // fp32: no host memory may reach an op either (bf16 widens into Backend scratch as well).
  g.set_strict(true);
  const Run got = guarded_run(l, g);
  EXPECT_EQ(got.resumed_at, 3);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.grad_norm, want.grad_norm);
  EXPECT_EQ(got.valid, want.valid);
  ASSERT_EQ(got.values.size(), want.values.size());
  EXPECT_EQ(std::memcmp(got.values.data(), want.values.data(), got.values.size() * sizeof(float)),
            0)
      << "final weights differ on rank " << W().rank();
  for (const std::string& op :
       std::set<std::string>(g.host_pointer_ops().begin(), g.host_pointer_ops().end()))
    ADD_FAILURE() << "host memory given to " << op;
  // Hundreds of ops per step: a run that fell back on the CPU backend would leave the guard idle.
  EXPECT_GT(g.ops(), 1000);
  // (The losses are real: a model that did not train would not change them.)
  EXPECT_NE(want.loss.front(), want.loss.back());
}

}  // namespace

TEST(DeviceParallel, TensorParallelEqualsCpuRun) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches({"tp", "tiny", {{"parallel.tp", "2"}}});
}

// SP in bf16: the activations gathered over the TP group are bf16 (2-byte) device buffers.
TEST(DeviceParallel, SequenceParallelBf16EqualsCpuRun) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches(
      {"sp", "tiny-llama", {{"parallel.tp", "2"}, {"parallel.sp", "true"}}, 2, "bf16"});
}

// Interleaved 1F1B over 2 ranks with 2 virtual stages each: activations and their gradients
// sent between stages in device buffers, the chunk-to-chunk handoff on one rank a device copy,
// the tied embedding's gradient all-reduced between first and last stage.
TEST(DeviceParallel, PipelineWithVirtualStagesEqualsCpuRun) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches(
      {"pp",
       "tiny",
       {{"parallel.pp", "2"}, {"parallel.vp", "2"}, {"parallel.pp_schedule", "\"interleaved\""}},
       4,
       "fp32",
       4});
}

// Ring attention: keys/values and the backward's dK/dV accumulators travel as tagged messages.
TEST(DeviceParallel, ContextParallelEqualsCpuRun) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches({"cp", "tiny-llama", {{"parallel.cp", "2"}, {"parallel.zero", "1"}}});
}

// The MoE token all-to-all (and the routing counts exchanged through a device buffer).
TEST(DeviceParallel, ExpertParallelEqualsCpuRun) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches({"ep", "tiny-moe", {{"parallel.ep", "2"}}});
}

LOOM_MPI_TEST_MAIN()
