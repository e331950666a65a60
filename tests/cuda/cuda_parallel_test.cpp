// Every parallel layout of the trainer on the GPU with two ranks on ONE GPU: the binary forks
// into two processes joined by a socket pair (tests/comm/pair_communicator.h: the GPU machine
// has no MPI), each trains on the same GPU (two CUDA contexts) with parallel.device_comm =
// "staged" (NCCL refuses two ranks on one GPU; the staged communicator copies device memory to
// the host and back around the pair communicator). Per layout -- TP, SP, PP with virtual stages,
// CP, EP -- six GPU steps track six steps of the same layout on the CPU trainer (1e-3 relative
// per step: TF32 GEMMs), and three GPU steps + a checkpoint + a new trainer resuming for three
// more equal the six straight GPU steps bit for bit (losses and this rank's weights). The fp8
// recipes across ranks as well: data parallelism with delayed scaling (the step's amaxes
// max-reduced over the two ranks through the staged communicator) and TP with MXFP8 (blocks of
// each rank's shard); their GPU curves track the CPU recipe's loosely (first step 2e-3, then
// 20%: fp8 curves on tiny batches are chaotic, docs/gpu.md), their resume bit for bit.
//
// Without a GPU the same flow runs with the guarded CPU backend standing in for the device
// (tests/kernels/guarded_backend.h: a host touch of its memory faults), where every step must
// equal the CPU trainer's bit for bit: the test's own logic and the staged exchange over the
// pair run everywhere CUDA builds (fp8 through the stand-in recipe of
// tests/precision/guarded_fp8_recipes.h). gpu_check.sh runs it on the GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/pair_communicator.h"
#include "cuda_train_util.h"
#include "kernels/guarded_backend.h"
#include "precision/device_fp8.h"
#include "precision/guarded_fp8_recipes.h"
#include "temp_dir.h"
#include "train/device.h"
#include "train/trainer.h"

using namespace loom;

namespace {

comm::Communicator* g_world = nullptr;

struct Layout {
  const char* name;
  const char* preset;
  std::vector<std::pair<std::string, std::string>> keys;
  int n_layer = 2;
  int grad_accum = 2;
  bool fp8 = false;        // an fp8 recipe: looser GPU tolerances (above)
  bool fp8_cores = false;  // a per-tensor fp8 recipe: cuBLASLt fp8 GEMMs (sm_89 or newer)
};

// `device`: "cpu", "cuda", or "" (a backend handed to the Trainer decides).
Config config(const std::string& dir, const Layout& l, const std::string& device, int ckpt) {
  Config c = test::tiny_train_config(dir, l.preset, 6, ckpt);
  c.set("model.n_layer", std::to_string(l.n_layer), "test");
  c.set("train.grad_accum", std::to_string(l.grad_accum), "test");
  c.set("parallel.device_comm", "\"staged\"", "test");
  if (!device.empty()) c.set("train.device", "\"" + device + "\"", "test");
  // One thread per rank: two processes whose OpenMP teams each want every core contend (here,
  // on 2 busy cores, the TP layout took 41 s with the default threads and 4 x 32 batches, 0.9 s
  // with one thread and the 2 x 16 batches below).
  c.set("train.threads", "1", "test");
  if (gpu_count() == 0) {
    // The stand-in run on the 2-core CI machine: smaller batches.
    c.set("train.micro_batch", "2", "test");
    c.set("train.seq_len", "16", "test");
  }
  for (const auto& [k, v] : l.keys) c.set(k, v, "test");
  return c;
}

struct Run {
  std::vector<double> loss;
  std::vector<float> weights;
};

Run straight(const Config& c, Backend* be) {
  Run r;
  Trainer t(c, g_world, be);
  for (int s = 0; s < 6; ++s) r.loss.push_back(t.train_step().loss);
  r.weights = test::trainer_weights(t);
  return r;
}

Run resumed(const Config& c, Backend* be) {
  Run r;
  {
    Trainer t(c, g_world, be);
    for (int s = 0; s < 3; ++s) r.loss.push_back(t.train_step().loss);
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  Trainer t(c, g_world, be);
  EXPECT_EQ(t.step(), 3);
  for (int s = 0; s < 3; ++s) r.loss.push_back(t.train_step().loss);
  r.weights = test::trainer_weights(t);
  return r;
}

void check(const Layout& l) {
  SCOPED_TRACE(l.name);
  ASSERT_EQ(g_world->size(), 2);
  const bool gpu = gpu_count() > 0;
  if (gpu && l.fp8_cores) {
    // The process's CUDA backend (the trainers below share it).
    Backend& be = *select_device("cuda", "test", true).backend;
    const int sm = device_fp8_target(be, 1, 16).sm_version;
    if (sm < 89) GTEST_SKIP() << "sm_" << sm << " has no fp8 tensor cores";
  }
  test::TempDir a("cudapar_cpu"), b("cudapar_dev"), d("cudapar_resume");
  const Run cpu = straight(config(a.str(), l, "cpu", 0), nullptr);
  test::GuardedBackend guard;
  Backend* dev = gpu ? nullptr : &guard;  // null: train.device = "cuda" picks the GPU
  std::unique_ptr<test::GuardedFp8Recipes::Registration> fp8_stand_in;
  if (!gpu && l.fp8) fp8_stand_in = std::make_unique<test::GuardedFp8Recipes::Registration>(guard);
  const std::string device = gpu ? "cuda" : "";
  const Run dev_run = straight(config(b.str(), l, device, 0), dev);
  const Run dev_resumed = resumed(config(d.str(), l, device, 3), dev);
  ASSERT_EQ(dev_run.loss.size(), cpu.loss.size());
  for (size_t s = 0; s < cpu.loss.size(); ++s) {
    const double rel = std::abs(dev_run.loss[s] - cpu.loss[s]) / std::abs(cpu.loss[s]);
    if (gpu) {
      EXPECT_LT(rel, !l.fp8   ? 1e-3
                     : s == 0 ? 2e-3
                              : 0.2)
          << "step " << s << ": gpu " << dev_run.loss[s] << ", cpu " << cpu.loss[s];
    } else {
      EXPECT_EQ(dev_run.loss[s], cpu.loss[s]) << "step " << s;
    }
  }
  EXPECT_EQ(dev_resumed.loss, dev_run.loss) << "the resumed run differs from the straight one";
  ASSERT_EQ(dev_resumed.weights.size(), dev_run.weights.size());
  EXPECT_EQ(0, std::memcmp(dev_resumed.weights.data(), dev_run.weights.data(),
                           dev_run.weights.size() * sizeof(float)))
      << "the resumed run's weights differ on rank " << g_world->rank();
  EXPECT_NE(cpu.loss.front(), cpu.loss.back()) << "the model did not train";
  if (!gpu) {
    EXPECT_GT(guard.ops(), 1000) << "the guarded backend was not used";
    if (fp8_stand_in) {
      EXPECT_GT(fp8_stand_in->counts.gemms, 0) << "no fp8 GEMM ran on the device";
    }
  }
  if (g_world->rank() == 0)
    std::printf("%s on %s: loss %.5f -> %.5f (cpu %.5f -> %.5f)\n", l.name,
                gpu ? "one GPU, 2 ranks" : "the guarded CPU backend", dev_run.loss.front(),
                dev_run.loss.back(), cpu.loss.front(), cpu.loss.back());
}

}  // namespace

TEST(CudaParallel, TensorParallel) {
  check({"tp", "tiny", {{"parallel.tp", "2"}}});
}

TEST(CudaParallel, SequenceParallel) {
  check({"sp", "tiny-llama", {{"parallel.tp", "2"}, {"parallel.sp", "true"}}});
}

TEST(CudaParallel, PipelineWithVirtualStages) {
  check({"pp",
         "tiny",
         {{"parallel.pp", "2"}, {"parallel.vp", "2"}, {"parallel.pp_schedule", "\"interleaved\""}},
         4,
         4});
}

TEST(CudaParallel, ContextParallel) {
  check({"cp", "tiny-llama", {{"parallel.cp", "2"}}});
}

TEST(CudaParallel, ExpertParallel) {
  check({"ep", "tiny-moe", {{"parallel.ep", "2"}}});
}

TEST(CudaParallel, DataParallelFp8Delayed) {
  check({"dp_fp8_delayed",
         "tiny",
         {{"precision.fp8_recipe", "\"fp8_tensorwise_delayed\""},
          {"precision.fp8_format", "\"hybrid\""},
          {"precision.fp8_amax_history", "4"}},
         2,
         2,
         true,
         true});
}

TEST(CudaParallel, TensorParallelMxfp8) {
  check({"tp_mxfp8",
         "tiny",
         {{"parallel.tp", "2"}, {"precision.fp8_recipe", "\"mxfp8\""}},
         2,
         2,
         true});
}

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  // Fork first: nothing may have touched the GPU or started threads yet.
  return test::run_all_tests_as_pair(&g_world, 170);
}
