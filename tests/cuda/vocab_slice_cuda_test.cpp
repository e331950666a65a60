// The vocabulary-slice ops (tensor parallelism) on the GPU against the CPU backend. Skipped
// without a device.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/cuda_test_util.h"
#include "kernels/backend.h"
#include "kernels/grad_check.h"

namespace loom {
namespace {

using test::close;
using test::DevBuf;
using test::gpu;
using test::random_floats;
using test::random_ints;
using test::same_bits;

TEST(CudaVocabSlice, EmbeddingSliceMatchesCpuAndIsDeterministic) {
  LOOM_REQUIRE_GPU();
  Backend& cpu = cpu_backend();
  const int Vl = 7, v0 = 7, C = 96, N = 300;
  auto table = random_floats(size_t(Vl) * C, 1);
  auto ids = random_ints(N, 2, 0, 20);  // in and out of the slice [7, 14), with repeats
  auto dout = random_floats(size_t(N) * C, 3), dt0 = random_floats(size_t(Vl) * C, 4);
  std::vector<float> out(size_t(N) * C), dt = dt0;
  cpu.embedding_forward_slice(out.data(), ids.data(), table.data(), N, C, v0, Vl);
  cpu.embedding_backward_slice(dt.data(), dout.data(), ids.data(), N, C, v0, Vl);
  DevBuf gt(table), gid(ids), gout(out.size() * 4), gdo(dout), gdt(dt0);
  gout.poison();
  gpu()->embedding_forward_slice(gout.f(), gid.i(), gt.f(), N, C, v0, Vl);
  EXPECT_TRUE(same_bits(gout.get(), out));
  gpu()->embedding_backward_slice(gdt.f(), gdo.f(), gid.i(), N, C, v0, Vl);
  const auto first = gdt.get();
  EXPECT_TRUE(same_bits(first, dt)) << "rows are added in token order, as on the CPU";
  gdt.set(dt0);
  gpu()->embedding_backward_slice(gdt.f(), gdo.f(), gid.i(), N, C, v0, Vl);
  EXPECT_TRUE(same_bits(gdt.get(), first));
}

TEST(CudaVocabSlice, CrossEntropyStepsMatchCpu) {
  LOOM_REQUIRE_GPU();
  Backend& cpu = cpu_backend();
  for (int Vl : {17, 1000, 25152}) {
    const int N = 6, v0 = Vl;  // the second slice of a vocabulary of 3 * Vl
    auto logits = random_floats(size_t(N) * Vl, 5, -6, 6);
    std::vector<int32_t> t = {0, Vl, -1, Vl + 5 % Vl, 2 * Vl + 1, 2 * Vl - 1};
    std::vector<float> w = {1.f, 0.5f, 1.f, -2.f, 0.f, 3.f};
    std::vector<float> mx(N), se(N), tl(N), loss(N), grad = logits;
    cpu.cross_entropy_slice_max(mx.data(), logits.data(), N, Vl);
    cpu.cross_entropy_slice_sums(se.data(), tl.data(), logits.data(), mx.data(), t.data(), N, Vl,
                                 v0);
    cpu.cross_entropy_slice_finish(loss.data(), grad.data(), grad.data(), mx.data(), se.data(),
                                   tl.data(), t.data(), N, Vl, v0, 0.125f, w.data());
    DevBuf gl(logits), gt(t), gw(w), gmx(N * 4), gse(N * 4), gtl(N * 4), gloss(N * 4);
    for (DevBuf* b : {&gmx, &gse, &gtl, &gloss}) b->poison();
    gpu()->cross_entropy_slice_max(gmx.f(), gl.f(), N, Vl);
    EXPECT_TRUE(same_bits(gmx.get(), mx)) << "Vl=" << Vl;
    gpu()->cross_entropy_slice_sums(gse.f(), gtl.f(), gl.f(), gmx.f(), gt.i(), N, Vl, v0);
    EXPECT_TRUE(close(gse.get(), se, 1e-5, 1e-6)) << "Vl=" << Vl;
    EXPECT_TRUE(same_bits(gtl.get(), tl)) << "Vl=" << Vl;
    gse.set(se);  // the same statistics as the CPU's from here
    gpu()->cross_entropy_slice_finish(gloss.f(), gl.f(), gl.f(), gmx.f(), gse.f(), gtl.f(), gt.i(),
                                      N, Vl, v0, 0.125f, gw.f());
    EXPECT_TRUE(close(gloss.get(), loss, 1e-6, 1e-6)) << "Vl=" << Vl;
    EXPECT_TRUE(close(gl.get(), grad, 1e-6, 1e-9)) << "Vl=" << Vl;
  }
}

TEST(CudaVocabSlice, Copy2dInterleaves) {
  LOOM_REQUIRE_GPU();
  const int n = 5, Vl = 7, T = 2, V = Vl * T;
  auto parts = random_floats(size_t(n) * V, 6);
  std::vector<float> want(size_t(n) * V);
  for (int r = 0; r < T; ++r)
    cpu_backend().copy_2d(want.data() + r * Vl, V * 4, parts.data() + size_t(r) * n * Vl, Vl * 4,
                          Vl * 4, n);
  DevBuf gp(parts), gr(want.size() * 4);
  gr.poison();
  for (int r = 0; r < T; ++r)
    gpu()->copy_2d(gr.f() + r * Vl, V * 4, gp.f() + size_t(r) * n * Vl, Vl * 4, Vl * 4, n);
  EXPECT_TRUE(same_bits(gr.get(), want));
}

}  // namespace
}  // namespace loom
