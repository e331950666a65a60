// Loads under the bf16 policy's 2-byte weights (ParamSet::drop_fp32): a resume reads the
// dropped parameters straight into their fp32 master (DataParallel::load_slices) instead of
// widening the model's fp32 container for the load; train.pretrained's master gets the
// checkpoint's fp32 values unrounded, the model their bf16 rounding.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "core/dtype.h"
#include "core/fs.h"
#include "kernels/cpu/gemm_bf16.h"
#include "parallel/data_parallel.h"
#include "temp_dir.h"
#include "train/trainer.h"
#include "train/trainer_setups.h"

using namespace loom;
using loom::test::quoted;

namespace {

bool has_bf16_gemms() {
  return cpu::bf16_gemm_path() == cpu::Bf16GemmPath::OneDnn;
}

// d_model 384 over 4 layers: about 7M linear weights, 28 MB of fp32 container, well above the
// few MB the rest of a load allocates.
Config load_config(const std::string& dir, const std::string& precision) {
  Config c = Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 4\nd_model = 384\nn_head = 4\nmax_seq = 32\n"
      "[train]\nmicro_batch = 1\nseq_len = 16\ngrad_accum = 1\nquiet = true\n"
      "peak_gflops = 100\nsteps = 1\n[optim]\nlr = 3e-3\n",
      "test.toml");
  c.set("train.out_dir", quoted(dir + "/run"), "test");
  c.set("data.paths", quoted(test::write_fox_corpus(dir, 50)), "test");
  c.set("precision.policy", quoted(precision), "test");
  return c;
}

// Anonymous resident memory (RssAnon): a fp32 container widened for a load is anonymous
// memory; the checkpoint's mapped files are not.
int64_t anon_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8)) * 1024;
  return -1;
}

// The highest RssAnon above its value at the start, sampled every 200 us while `work` runs.
template <class F>
int64_t anon_growth_during(F&& work) {
  const int64_t base = anon_rss_bytes();
  std::atomic<bool> done{false};
  std::atomic<int64_t> peak{base};
  std::thread sampler([&] {
    while (!done.load()) {
      const int64_t now = anon_rss_bytes();
      if (now > peak.load()) peak.store(now);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  work();
  done.store(true);
  sampler.join();
  return peak.load() - base;
}

float* volatile g_escaped = nullptr;

// Control for a bound on the growth: the sampler sees `bytes` of anonymous memory (as much as
// a widened fp32 container) allocated and touched for as long as a load lasts.
bool sampler_sees(int64_t bytes) {
  // Fresh pages straight from mmap: a std::vector could be served from heap memory the process
  // already holds (glibc raises its mmap threshold after a large block is freed), and then the
  // control would measure the allocator, not the sampler.
  const int64_t growth = anon_growth_during([&] {
    void* p =
        mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::memset(p, 1, size_t(bytes));
    g_escaped = static_cast<float*>(p);  // (so that no compiler elides the writes)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    munmap(p, size_t(bytes));
  });
  std::printf("control: +%.1f MiB while %.1f MiB is allocated\n", double(growth) / (1 << 20),
              double(bytes) / (1 << 20));
  return growth > bytes * 9 / 10;
}

int64_t dropped_bytes(const ParamSet& P) {
  int64_t n = 0;
  for (const ParamInfo& p : P.infos())
    if (p.fp32_dropped) n += 4 * p.numel;
  return n;
}

}  // namespace

// The resume of a bf16 run with dropped weights grows anonymous memory by well under the fp32
// container (a load that widened it first grew by all of it: the control below shows the
// sampler sees such a widening), and the run it resumes equals the one saved, bit for bit.
TEST(Bf16Load, ResumeDoesNotRebuildTheFp32Container) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "no AVX512-BF16: the fp32 container stays";
  const std::string d = test::scoped_dir("bf16_load_resume");
  Trainer t(load_config(d, "bf16"));
  t.train_step();
  t.save_checkpoint();
  t.finish_checkpoints();
  ParamSet& P = t.model().params();
  const int64_t container = dropped_bytes(P);
  ASSERT_GT(container, int64_t(24) << 20);
  std::vector<uint16_t> saved(P.bf16_data(), P.bf16_data() + P.total());
  // Scramble the bf16 copy: the resume must bring back every weight.
  std::fill(P.bf16_data(), P.bf16_data() + P.total(), uint16_t(0x3f80));
  const int64_t growth = anon_growth_during([&] { t.resume_from(d + "/run/checkpoints"); });
  EXPECT_LT(growth, container / 2) << "the resume grew anonymous memory by " << (growth >> 20)
                                   << " MiB; the fp32 container is " << (container >> 20) << " MiB";
  std::printf("resume: anonymous memory +%.1f MiB during the load; fp32 container %.1f MiB\n",
              double(growth) / (1 << 20), double(container) / (1 << 20));
  EXPECT_EQ(dropped_bytes(P), container);  // still dropped
  EXPECT_EQ(0, std::memcmp(saved.data(), P.bf16_data(), 2 * saved.size()));
  EXPECT_TRUE(sampler_sees(container));
}

// A save at ZeRO-0 widens the dropped parameters one at a time as it writes them (the largest,
// blocks' MLP weights, 2.4 MB of fp32), not the whole fp32 container at once (28 MB, which the
// control shows the sampler sees); the model file is bit for bit what writing every parameter
// widened (host_values) gives, written synchronously and from an asynchronous save's snapshot.
TEST(Bf16Load, SaveWidensOneParameterAtATime) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "no AVX512-BF16: the fp32 container stays";
  const std::string d = test::scoped_dir("bf16_load_save");
  for (const bool async : {false, true}) {
    const std::string run = d + (async ? "/async" : "/sync");
    make_dirs(run);
    Config c = load_config(run, "bf16");
    c.set("train.ckpt_async", async ? "true" : "false", "test");
    Trainer t(c);
    t.train_step();
    const ParamSet& P = t.model().params();
    const int64_t container = dropped_bytes(P);
    ASSERT_GT(container, int64_t(24) << 20);
    const int64_t growth = anon_growth_during([&] { t.save_checkpoint(); });
    t.finish_checkpoints();
    if (!async) {  // (an asynchronous save snapshots every tensor: the copy is its design)
      std::printf("save: anonymous memory +%.1f MiB; fp32 container %.1f MiB\n",
                  double(growth) / (1 << 20), double(container) / (1 << 20));
      EXPECT_LT(growth, container / 4)
          << "the save grew anonymous memory by " << (growth >> 20)
          << " MiB; the fp32 container is " << (container >> 20) << " MiB";
      EXPECT_TRUE(sampler_sees(container));
    }
    const std::string widened = run + "/widened.safetensors";
    ckpt::write_safetensors(widened, P.host_values(), {{"format", "pt"}, {"loom.kind", "model"}});
    const ckpt::Checkpoint saved(run + "/run/checkpoints");
    EXPECT_TRUE(read_file(saved.dir() + "/model.safetensors") == read_file(widened))
        << (async ? "async" : "sync") << " save";
  }
}

// train.pretrained into a bf16 run with dropped weights: the master holds the checkpoint's fp32
// values exactly (as it did when the model's container was widened for the load), the model
// (the bf16 copy) their rounding, for every parameter.
TEST(Bf16Load, PretrainedFillsTheMasterUnroundedAndTheCopyRounded) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "no AVX512-BF16: the fp32 container stays";
  const std::string d = test::scoped_dir("bf16_load_pretrained");
  make_dirs(d + "/a");
  make_dirs(d + "/b");
  {
    Trainer fp32(load_config(d + "/a", "fp32"));
    fp32.train_step();  // values off the bf16 grid
    fp32.save_checkpoint();
    fp32.finish_checkpoints();
  }
  const ckpt::Checkpoint src(d + "/a/run/checkpoints");
  Config c = load_config(d + "/b", "bf16");
  c.set("train.pretrained", quoted(d + "/a/run/checkpoints"), "test");
  Trainer t(c);
  const ParamSet& P = t.model().params();
  ASSERT_GT(dropped_bytes(P), 0);
  std::map<std::string, Tensor> master;
  for (const auto& s : t.data_parallel()->state_slices())
    if (s.name.rfind("master.", 0) == 0) master[s.name.substr(7)] = s.tensor;
  std::vector<float> v(size_t(P.total()));
  P.read_values(0, P.total(), v.data());
  int64_t off_grid = 0;
  for (const ParamInfo& p : P.infos()) {
    const Tensor w = src.model().load(p.name);
    ASSERT_EQ(w.numel(), p.numel) << p.name;
    ASSERT_TRUE(master.count(p.name)) << p.name;
    const float* m = master.at(p.name).data<float>();
    for (int64_t i = 0; i < p.numel; ++i) {
      const float x = w.data<float>()[i];
      ASSERT_EQ(m[i], x) << p.name << " " << i;
      ASSERT_EQ(v[size_t(p.offset + i)], round_bf16(x)) << p.name << " " << i;
      off_grid += round_bf16(x) != x;
    }
  }
  EXPECT_GT(off_grid, 0);  // so that an unrounded master and a rounded one differ
}
