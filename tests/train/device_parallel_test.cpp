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

#include <string>

#include "kernels/guarded_backend.h"
#include "mpi_main.h"
#include "train/device_layouts.h"

using namespace loom;
using namespace loom::testing_parallel;

namespace {

const TrainerRuns runs{"devpar", "a parallel device fox "};

void expect_layout_matches(const Layout& l) {
  SCOPED_TRACE(l.name);
  use_fallback_bf16_gemm();
  const LayoutRun want = cpu_layout_run(layout_config(runs, runs.dir(cat(l.name, "_cpu")), l));
  test::GuardedBackend g;
  // fp32: no host memory may reach an op either (bf16 widens into Backend scratch as well).
  g.set_strict(true);
  const LayoutRun got =
      guarded_layout_run(layout_config(runs, runs.dir(cat(l.name, "_dev")), l), g);
  // Hundreds of ops per step.
  expect_same_run(want, got, g, 1000);
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
