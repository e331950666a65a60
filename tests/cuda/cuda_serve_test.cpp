// The serving engine on the GPU (skipped without one): the paged KV-cache ops of the CUDA
// backend against the CPU backend's (decode and prefill chunks, GQA, a head dim that is not a
// multiple of 32, fp32 and bf16 pools), a bad block index thrown at the step's sync, and the
// whole engine (the real Decoder, every schedule of tests/infer/engine_replay.h: prefix
// sharing, chunked prefill, preemption) giving the CPU engine's greedy tokens, with logprobs
// within a stated tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda_test_util.h"
#include "infer/engine_replay.h"
#include "kernels/paged_kv.h"

using namespace loom;
namespace rp = loom::infer::test;

namespace {

struct PagedCase {
  DType dtype;
  int D;
};

// The same op sequence (write the new rows, attend) on a backend; returns out and both pools
// (as raw bytes widened to floats for comparison).
struct PagedResult {
  std::vector<float> out;
  std::vector<uint8_t> k, v;
};

PagedResult run_paged(Backend& be, const PagedCase& pc) {
  const int Hq = 8, Hkv = 2, D = pc.D, bs = 4, nb = 24;
  const size_t pool = size_t(nb) * bs * Hkv * D * dtype_size(pc.dtype);
  // Chunks: a prefill of 5 from 0, a decode at position 37, a later chunk of 3 at 17; block
  // tables deliberately out of order.
  std::vector<std::vector<int32_t>> tables = {{3, 1}, {}, {}};
  for (int b = 0; b < 10; ++b) tables[1].push_back(23 - b);
  for (int b = 0; b < 5; ++b) tables[2].push_back(4 + 2 * b);
  PagedChunkTable t;
  t.clear(3);
  t.add(5, 0, tables[0].data(), 2);
  t.add(1, 37, tables[1].data(), 10);
  t.add(3, 17, tables[2].data(), 5);
  const int rows = t.rows(), ld = (Hq + 2 * Hkv) * D;
  // The earlier positions of chunks 2 and 3 (their cache before this step) are written first,
  // as rows of a "previous step" (chunk 2: 0..36, chunk 3: 0..16).
  PagedChunkTable past;
  past.clear(2);
  past.add(37, 0, tables[1].data(), 10);
  past.add(17, 0, tables[2].data(), 5);
  auto rand_rows = [&](int n, uint64_t seed) {
    std::vector<float> x(size_t(n) * ld);
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal_at(seed, 0, i);
    return x;
  };
  const std::vector<float> qkv_past = rand_rows(past.rows(), 11), qkv = rand_rows(rows, 12);
  BackendBuffer kp = BackendBuffer::zeroed(be, pool, "test"),
                vp = BackendBuffer::zeroed(be, pool, "test");
  BackendBuffer tb(be, t.ints().size() * 4, "test"), pb(be, past.ints().size() * 4, "test");
  BackendBuffer xb(be, qkv.size() * 4, "test"), xp(be, qkv_past.size() * 4, "test");
  BackendBuffer ob(be, size_t(rows) * Hq * D * 4, "test");
  be.copy_h2d(tb.data(), t.ints().data(), t.ints().size() * 4);
  be.copy_h2d(pb.data(), past.ints().data(), past.ints().size() * 4);
  be.copy_h2d(xb.data(), qkv.data(), qkv.size() * 4);
  be.copy_h2d(xp.data(), qkv_past.data(), qkv_past.size() * 4);
  be.fill_bytes(ob.data(), 0xFF, size_t(rows) * Hq * D * 4);  // NaN: an unwritten output fails
  PagedKvBuffers c;
  c.k = kp.data();
  c.v = vp.data();
  c.dtype = pc.dtype;
  c.num_blocks = nb;
  c.block_size = bs;
  c.n_kv_head = Hkv;
  c.head_dim = D;
  const float* xpf = xp.as<float>();
  be.paged_kv_write(c, xpf + Hq * D, xpf + (Hq + Hkv) * D, ld, pb.as<int32_t>(), past.chunks(),
                    past.rows());
  const float* x = xb.as<float>();
  be.paged_kv_write(c, x + Hq * D, x + (Hq + Hkv) * D, ld, tb.as<int32_t>(), t.chunks(), rows);
  be.paged_attention(ob.as<float>(), x, ld, c, tb.as<int32_t>(), t.chunks(), rows, Hq,
                     1.f / std::sqrt(float(D)));
  be.sync();
  PagedResult r;
  r.out.resize(size_t(rows) * Hq * D);
  r.k.resize(pool);
  r.v.resize(pool);
  be.copy_d2h(r.out.data(), ob.data(), r.out.size() * 4);
  be.copy_d2h(r.k.data(), kp.data(), pool);
  be.copy_d2h(r.v.data(), vp.data(), pool);
  return r;
}

}  // namespace

TEST(CudaPaged, OpsMatchTheCpuBackend) {
  LOOM_REQUIRE_GPU();
  for (PagedCase pc : {PagedCase{DType::F32, 64}, PagedCase{DType::BF16, 64},
                       PagedCase{DType::F32, 40}, PagedCase{DType::BF16, 128}}) {
    const PagedResult want = run_paged(cpu_backend(), pc);
    const PagedResult got = run_paged(*test::gpu(), pc);
    // The write copies (or rounds to nearest even): the pools agree bit for bit.
    EXPECT_EQ(got.k, want.k) << dtype_name(pc.dtype) << " D=" << pc.D;
    EXPECT_EQ(got.v, want.v) << dtype_name(pc.dtype) << " D=" << pc.D;
    EXPECT_TRUE(test::close(got.out, want.out, 1e-5, 1e-5))
        << dtype_name(pc.dtype) << " D=" << pc.D;
  }
}

TEST(CudaPaged, BadBlockIndexThrowsAtSync) {
  LOOM_REQUIRE_GPU();
  Backend& be = *test::gpu();
  const int Hkv = 1, D = 32, bs = 4, nb = 2;
  BackendBuffer kp = BackendBuffer::zeroed(be, size_t(nb) * bs * D * 4, "test");
  BackendBuffer vp = BackendBuffer::zeroed(be, size_t(nb) * bs * D * 4, "test");
  PagedKvBuffers c;
  c.k = kp.data();
  c.v = vp.data();
  c.num_blocks = nb;
  c.block_size = bs;
  c.n_kv_head = Hkv;
  c.head_dim = D;
  PagedChunkTable t;
  const int32_t far[] = {9};
  t.clear(1);
  t.add(1, 0, far, 1);
  BackendBuffer tb(be, t.ints().size() * 4, "test"), xb(be, 3 * D * 4, "test");
  BackendBuffer ob(be, D * 4, "test");
  be.copy_h2d(tb.data(), t.ints().data(), t.ints().size() * 4);
  be.fill_bytes(xb.data(), 0, 3 * D * 4);
  be.paged_kv_write(c, xb.as<float>() + D, xb.as<float>() + 2 * D, 3 * D, tb.as<int32_t>(), 1, 1);
  try {
    be.sync();
    ADD_FAILURE() << "a block index outside the pool was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names KV block 9"), std::string::npos) << e.what();
  }
  be.sync();  // reported once, then cleared
}

TEST(CudaServe, EngineMatchesTheCpuEngine) {
  LOOM_REQUIRE_GPU();
  for (Family f : {Family::GPT2, Family::Llama})
    for (DType act : {DType::F32, DType::BF16})
      for (const rp::ReplaySetup& s : rp::replay_setups()) {
        const rp::Replay want = rp::replay(cpu_backend(), f, act, s);
        const rp::Replay got = rp::replay(*test::gpu(), f, act, s);
        const std::string at =
            std::string(family_name(f)) + " " + dtype_name(act) + " [" + s.name + "]";
        // fp32: the same tokens and the same schedule; logprobs agree to GEMM rounding (the
        // closest greedy choice of these models is 0.002 apart). bf16 rounds every layer's
        // output, the logits included: a GEMM that sums in another order can round an
        // activation to the neighbouring bf16 value, and that reaches the logits. Measured on
        // these models (CPU): bf16 and fp32 logprobs up to 0.074 apart, and exact ties among the
        // rounded logits. So a request may take the other token where the CPU's best two are
        // within 0.1 (its continuation is then not compared), and logprobs agree within 0.1; a
        // wrong cache block or position moves them by far more.
        const double tol = act == DType::F32 ? 1e-4 : 0.1, tie = act == DType::F32 ? 0 : 0.1;
        EXPECT_EQ(rp::replay_differences(
                      want, got,
                      [tol](const std::vector<float>& g, const std::vector<float>& w) {
                        const ::testing::AssertionResult r = test::close(g, w, 0, tol);
                        return r ? std::string() : std::string(r.message());
                      },
                      " " + at, tie),
                  "");
      }
}
