// Bad input around train.device: an unknown device, "cuda" where there is no CUDA build or no
// GPU, and what the device path does not run yet (refused up front over the guarded backend,
// which stands for a device here). Each is a loom::Error naming the key, thrown before the run
// directory exists: nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "kernels/guarded_backend.h"
#include "precision/guarded_fp8_recipes.h"
#include "temp_dir.h"
#include "train/device.h"
#include "train/trainer.h"

using namespace loom;

namespace {

Config config(const std::string& dir) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "a small corpus line " + std::to_string(i) + "\n";
  write_file_atomic(dir + "/corpus.txt", text);
  Config c = Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 1\nd_model = 32\nn_head = 2\nmax_seq = 32\n"
      "[train]\nmicro_batch = 2\nseq_len = 16\nquiet = true\nsteps = 2\npeak_gflops = 100\n"
      "tensorboard = false\n",
      "test.toml");
  c.set("train.out_dir", "\"" + dir + "/run\"", "test");
  c.set("data.paths", "\"" + dir + "/corpus.txt\"", "test");
  return c;
}

// Constructing the trainer throws an error containing `what`, and the run directory is not there.
void expect_refused(const Config& c, Backend* be, const std::string& dir, const std::string& what) {
  try {
    Trainer t(c, nullptr, be);
    ADD_FAILURE() << "no error; expected one containing: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/run")) << "the refused run wrote " << dir << "/run";
}

}  // namespace

TEST(DeviceBadInput, UnknownDeviceNamesTheKey) {
  test::TempDir d("devbad_unknown");
  Config c = config(d.str());
  c.set("train.device", "\"gpu\"", "test");
  expect_refused(c, nullptr, d.str(), "train.device must be cpu, cuda or auto, got 'gpu'");
  EXPECT_THROW(check_device("tpu", "--device"), Error);
}

TEST(DeviceBadInput, CudaWithoutABuildOrAGpuNamesTheKey) {
  if (gpu_count() > 0) GTEST_SKIP() << "a GPU is visible: train.device = cuda is valid here";
  test::TempDir d("devbad_cuda");
  Config c = config(d.str());
  c.set("train.device", "\"cuda\"", "test");
  const std::string why = cuda_built()
                              ? "train.device = cuda: no CUDA device is visible"
                              : "train.device = cuda: this loom was built without the CUDA backend";
  expect_refused(c, nullptr, d.str(), why);
  try {
    check_device("cuda", "--device");
    ADD_FAILURE() << "check_device(cuda) passed without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device = cuda"), std::string::npos) << e.what();
  }
}

TEST(DeviceBadInput, AutoWithoutAGpuTrainsOnTheCpu) {
  if (gpu_count() > 0) GTEST_SKIP() << "a GPU is visible: auto picks it";
  test::TempDir d("devbad_auto");
  Config c = config(d.str());
  c.set("train.device", "\"auto\"", "test");
  Trainer t(c);
  EXPECT_TRUE(t.model().params().host_accessible());
  EXPECT_TRUE(std::isfinite(t.train_step().loss));
}

// The notice of "auto" falling back on the CPU fits every caller (training, bench, generate,
// serve all pick their device through select_device): it says which key chose what, not what
// the caller goes on to do.
TEST(DeviceBadInput, AutoNoticeIsWordedForEveryCaller) {
  if (gpu_count() > 0) GTEST_SKIP() << "a GPU is visible: auto picks it";
  ::testing::internal::CaptureStdout();
  const DeviceChoice dc = select_device("auto", "--device", /*quiet=*/false);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_FALSE(dc.cuda);
  EXPECT_NE(out.find("--device = auto: "), std::string::npos) << out;
  EXPECT_NE(out.find("; using the CPU"), std::string::npos) << out;
  EXPECT_EQ(out.find("training"), std::string::npos) << out;
}

// What the device path does not cover yet is refused by name, before anything is written (a
// device run must not start and crash later). Every parallel layout trains on a device (TP, PP,
// CP and EP over device communicators, tests/train/device_parallel_test.cpp), as do ZeRO-3, bf16
// gradient reduction, LoRA and DPO; some FP8 recipes do not yet. A device communicator that is
// not one of the three, or NCCL in a build without it, is refused by its key.
TEST(DeviceBadInput, UnsupportedFeaturesOnADeviceAreRefusedUpFront) {
  struct Case {
    const char* key;
    const char* value;
    const char* message;
  };
  const Case cases[] = {
      {"parallel.device_comm", "\"mpi\"",
       "parallel.device_comm must be auto, nccl or staged, got 'mpi'"},
      {"parallel.device_comm", nccl_built() ? "\"bogus\"" : "\"nccl\"",
       nccl_built() ? "parallel.device_comm must be auto, nccl or staged, got 'bogus'"
                    : "parallel.device_comm = nccl: this loom was built without the NCCL"},
      {"precision.fp8_recipe", "\"fp8_tensorwise_current\"", "precision.fp8_recipe"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.key);
    test::TempDir d("devbad_feature");
    test::GuardedBackend g;
    Config c = config(d.str());
    c.set(k.key, k.value, "test");
    expect_refused(c, &g, d.str(), k.message);
  }
}

// FP8 on a device is not refused for its layout (a pipeline stage): only for what the
// backend lacks (here: no fp8 recipe on a non-CUDA device), by name, before anything is written.
TEST(DeviceBadInput, Fp8WithPipelineParallelismIsRefusedOnlyForTheBackend) {
  test::TempDir d("devbad_fp8tp");
  test::GuardedBackend g;
  Config c = config(d.str());
  c.set("precision.fp8_recipe", "\"fp8_tensorwise_current\"", "test");
  c.set("parallel.pp", "2", "test");
  expect_refused(c, &g, d.str(), "the fp8 recipes run on the CPU and on the CUDA backend only");
}

// FP8 with ZeRO-3 is refused by name up front, on the CPU and on a device alike (the device
// here the guarded backend with the stand-in GPU recipe registered, so the refusal is not the
// "no fp8 on this backend" one): the keys named, nothing written.
TEST(DeviceBadInput, Fp8WithZero3IsRefusedUpFront) {
  for (const char* recipe : {"fp8_tensorwise_current", "fp8_tensorwise_delayed", "mxfp8"})
    for (bool device : {false, true}) {
      SCOPED_TRACE(std::string(recipe) + (device ? " on the device" : " on the CPU"));
      test::TempDir d("devbad_fp8z3");
      test::GuardedBackend g;
      test::GuardedFp8Recipes::Registration stand_in(g);
      Config c = config(d.str());
      c.set("precision.fp8_recipe", std::string("\"") + recipe + "\"", "test");
      c.set("parallel.zero", "3", "test");
      expect_refused(c, device ? &g : nullptr, d.str(),
                     std::string("precision.fp8_recipe = \"") + recipe +
                         "\" is not supported with parallel.zero = 3");
      EXPECT_EQ(stand_in.counts.recipes, 0);
    }
}

// Context parallelism: the trainer checks the fp8 alignment on a rank's share of the micro-batch
// (micro_batch x seq_len / cp), up front: 1 x 16 tokens over cp = 2 (8 per rank) is refused
// naming the keys, though 16 is a multiple of 16; 2 x 16 (16 per rank) passes that check and
// is refused only later, for the world of one process that cannot hold cp = 2.
TEST(DeviceBadInput, Fp8UnderContextParallelismChecksTheRanksShare) {
  for (int micro_batch : {1, 2}) {
    SCOPED_TRACE(micro_batch);
    test::TempDir d("devbad_fp8cp");
    test::GuardedBackend g;
    test::GuardedFp8Recipes::Registration stand_in(g);
    Config c = config(d.str());
    c.set("precision.policy", "\"bf16\"", "test");
    c.set("precision.fp8_recipe", "\"fp8_tensorwise_current\"", "test");
    c.set("parallel.cp", "2", "test");
    c.set("train.micro_batch", std::to_string(micro_batch), "test");
    try {
      Trainer t(c, nullptr, &g);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      const bool fp8_refusal =
          what.find("train.micro_batch x train.seq_len / parallel.cp") != std::string::npos;
      EXPECT_EQ(fp8_refusal, micro_batch == 1) << what;
      if (micro_batch == 1) {
        EXPECT_NE(what.find("got 16 tokens over 2 ranks"), std::string::npos) << what;
      }
    }
    EXPECT_FALSE(std::filesystem::exists(d.str() + "/run"));
    EXPECT_EQ(stand_in.counts.recipes, 0);
  }
}
