// The serving engine on a device: its KV pool, chunk tables and attention go through the
// Backend (Backend::paged_kv_write / paged_attention), so on the guarded backend (every buffer
// PROT_NONE outside its ops: any host read of the pool, the block tables or the activations
// faults) the engine must give the CPU engine's greedy tokens and logprobs bit for bit, for both
// families, fp32 and bf16 caches, prefix sharing, chunked prefill and preemption. Plus the
// paged ops' bad input through the Backend.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "kernels/guarded_backend.h"
#include "kernels/paged_kv.h"
#include "same_bits.h"

#include "engine_replay.h"

using namespace loom;
using namespace loom::infer;
namespace rp = loom::infer::test;  // the replays (loom::test holds the guarded backend)

namespace {

// In the child: every schedule on the CPU and on the guarded backend; exits 0 only when all
// agree and each schedule showed what it exercises.
[[noreturn]] void guarded_engine_child(Family f, DType act) {
  // One thread: the bits do not depend on the thread count, and many tiny steps under a loaded
  // machine's spinning OpenMP barriers took 20 s instead of a few.
  omp_set_num_threads(1);
  std::string bad;
  for (const rp::ReplaySetup& s : rp::replay_setups()) {
    const rp::Replay want = rp::replay(cpu_backend(), f, act, s);
    loom::test::GuardedBackend g;
    g.set_strict(true);
    rp::Replay got;
    try {
      got = rp::replay(g, f, act, s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: the guarded engine threw: %s\n", s.name, e.what());
      std::exit(2);
    }
    const std::string at = std::string(" [") + s.name + "]";
    // Bit for bit, and the logprobs really reported.
    bad += rp::replay_differences(
        want, got,
        [](const std::vector<float>& g, const std::vector<float>& w) {
          if (w.empty()) return std::string("none reported");
          return loom::test::same_bits(g, w) ? std::string() : std::string("bits differ");
        },
        at);
    if (std::string(s.name) == "preemption" && want.preemptions == 0) bad += " no preemption";
    if (std::string(s.name) == "one at a time" && want.cached_tokens == 0) bad += " no prefix hit";
    for (const std::string& op :
         std::set<std::string>(g.host_pointer_ops().begin(), g.host_pointer_ops().end()))
      bad += " (host memory given to " + op + ")" + at;
    if (g.ops() < 100) bad += " (too few ops through the guarded backend)" + at;
  }
  if (!bad.empty())
    std::fprintf(stderr, "guarded engine differs from the CPU engine:%s\n", bad.c_str());
  std::exit(bad.empty() ? 0 : 1);
}

}  // namespace

TEST(EngineDevice, GuardedBackendEngineEqualsTheCpuEngineBitForBit) {
  // Re-executes the binary for the child: OpenMP's thread pool does not survive fork().
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Both families and both cache types in two runs (each replays five schedules twice).
  EXPECT_EXIT(guarded_engine_child(Family::GPT2, DType::F32), ::testing::ExitedWithCode(0), "")
      << "gpt2, fp32 cache";
  EXPECT_EXIT(guarded_engine_child(Family::Llama, DType::BF16), ::testing::ExitedWithCode(0), "")
      << "llama (GQA), bf16 cache";
}

TEST(EngineDevice, KvPoolAndChunkTablesLiveInTheBackend) {
  loom::test::GuardedBackend g;
  Decoder m(rp::tiny(Family::Llama), g);
  m.params().init(5);
  DecoderRunner runner(m);
  ASSERT_EQ(runner.cache_backend(), &g);
  const size_t before = g.live_buffers();
  {
    EngineConfig cfg;
    cfg.block_size = 8;
    cfg.num_blocks = 16;
    LoomEngine e(runner, cfg);
    EXPECT_EQ(g.live_buffers(), before + 1);  // the pool, one buffer of the backend
    EXPECT_NE(g.memory_report().find("kv_cache"), std::string::npos) << g.memory_report();
  }
  EXPECT_EQ(g.live_buffers(), before);  // freed with the engine (no host spare pool)
  Decoder on_cpu(rp::tiny(Family::GPT2), cpu_backend());
  EXPECT_EQ(DecoderRunner(on_cpu).cache_backend(), nullptr);  // the CPU engine keeps its host pool
}

// A chunk table naming a block outside the pool, or too short for its chunk, is an error naming
// the chunk, through the Backend as the runner calls it (the CPU backend throws at once; a
// device records it and throws at the step's sync).
TEST(EngineDevice, PagedOpsRefuseBadBlockTables) {
  Backend& be = cpu_backend();
  const int Hkv = 2, D = 8, bs = 4, nb = 3;
  std::vector<float> k(size_t(nb) * bs * Hkv * D), v(k.size());
  PagedKvBuffers c;
  c.k = k.data();
  c.v = v.data();
  c.num_blocks = nb;
  c.block_size = bs;
  c.n_kv_head = Hkv;
  c.head_dim = D;
  std::vector<float> q(size_t(2) * 3 * Hkv * D, 0.5f), out(size_t(2) * Hkv * D);
  const int ld = 3 * Hkv * D;
  auto run = [&](const PagedChunkTable& t) {
    be.paged_kv_write(c, q.data() + Hkv * D, q.data() + 2 * Hkv * D, ld, t.ints().data(),
                      t.chunks(), t.rows());
    be.paged_attention(out.data(), q.data(), ld, c, t.ints().data(), t.chunks(), t.rows(), Hkv,
                       1.f);
  };
  PagedChunkTable good, outside, short_table;
  const int32_t ok[] = {2}, far[] = {7};
  good.clear(1);
  good.add(2, 1, ok, 1);
  EXPECT_NO_THROW(run(good));
  outside.clear(1);
  outside.add(2, 1, far, 1);
  EXPECT_THROW(
      {
        try {
          run(outside);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("names block 7"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  short_table.clear(1);
  short_table.add(2, 3, ok, 1);  // positions 3 and 4 need two blocks of 4
  EXPECT_THROW(run(short_table), Error);
  // The op's row count must match the table's.
  EXPECT_THROW(be.paged_attention(out.data(), q.data(), ld, c, good.ints().data(), 1, 3, Hkv, 1.f),
               Error);
}
