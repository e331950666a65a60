// Every CUDA op against the CPU op on the same random inputs. Outputs are poisoned with NaN
// before each GPU run (NaN never passes), accumulated outputs start from the same random
// values on both sides. Tolerances (fp32 storage throughout):
//   pointwise / row ops     rtol 1e-5..1e-4 (different exp/sqrt implementations, sum orders)
//   GEMM fp32               1e-5 of the output's max magnitude; tf32 2e-3, bf16/fp16 1.5e-2
//   attention               rtol 2e-4, atol 2e-5 (forward), 1e-3 / 1e-4 (backward)
// Without a CUDA device every test reports SKIPPED.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "cuda/cuda_test_util.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/grad_check.h"

namespace loom {
namespace {

using test::close;
using test::close_scaled;
using test::DevBuf;
using test::gpu;
using test::random_floats;
using test::random_ints;
using test::same_bits;

Backend& cpu() {
  return cpu_backend();
}

// ------------------------------------------------------------------------------------ GEMM

void check_gemm(bool ta, bool tb, int M, int N, int K, int pad, float alpha, float beta,
                double rel) {
  const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  auto A = random_floats(size_t(ta ? K : M) * lda, 1);
  auto B = random_floats(size_t(tb ? N : K) * ldb, 2);
  auto C = random_floats(size_t(M) * ldc, 3);
  std::vector<float> ref = C;
  cpu().gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, ref.data(), ldc);
  DevBuf dA(A), dB(B), dC(C);
  if (beta == 0.f) dC.poison();  // beta == 0 must not read C
  gpu()->gemm(ta, tb, M, N, K, alpha, dA.f(), lda, dB.f(), ldb, beta, dC.f(), ldc);
  auto got = dC.get();
  // Padding columns of C are never written: compare only the M x N part.
  std::vector<float> g, c;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      g.push_back(got[size_t(i) * ldc + j]);
      c.push_back(ref[size_t(i) * ldc + j]);
    }
  EXPECT_TRUE(close_scaled(g, c, rel))
      << "ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K
      << " math=" << gemm_math_name(gpu()->gemm_math());
}

TEST(CudaGemm, AllTransposesAlphaBetaPaddedStrides) {
  LOOM_REQUIRE_GPU();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm(ta, tb, 37, 53, 71, 0, 1.f, 0.f, 1e-5);
      check_gemm(ta, tb, 64, 96, 128, 3, 0.5f, 1.f, 1e-5);
      check_gemm(ta, tb, 5, 7, 1, 1, -2.f, 0.25f, 1e-5);
    }
}

TEST(CudaGemm, EmptyInnerDimensionScalesC) {
  LOOM_REQUIRE_GPU();
  auto C = random_floats(6 * 4, 4);
  DevBuf dC(C);
  gpu()->gemm(false, false, 6, 4, 0, 1.f, nullptr, 1, nullptr, 4, 0.5f, dC.f(), 4);
  auto got = dC.get();
  for (size_t i = 0; i < C.size(); ++i) EXPECT_EQ(got[i], 0.5f * C[i]);
  dC.poison();
  gpu()->gemm(false, false, 6, 4, 0, 1.f, nullptr, 1, nullptr, 4, 0.f, dC.f(), 4);
  for (float x : dC.get()) EXPECT_EQ(x, 0.f);  // beta == 0 clears NaN
}

TEST(CudaGemm, TensorCoreMathModes) {
  LOOM_REQUIRE_GPU();
  const GemmMath saved = gpu()->gemm_math();
  const std::pair<GemmMath, double> modes[] = {
      {GemmMath::TF32, 2e-3}, {GemmMath::BF16, 1.5e-2}, {GemmMath::FP16, 1.5e-2}};
  for (auto [m, rel] : modes) {
    gpu()->set_gemm_math(m);
    check_gemm(false, true, 128, 256, 512, 0, 1.f, 0.f, rel);
    check_gemm(true, false, 96, 64, 200, 0, 1.f, 1.f, rel);
  }
  gpu()->set_gemm_math(saved);
}

TEST(CudaGemm, Batched) {
  LOOM_REQUIRE_GPU();
  const int M = 17, N = 33, K = 24, batch = 5;
  const int64_t sa = M * K + 7, sb = K * N + 3, sc = M * N + 1;
  auto A = random_floats(sa * batch, 5), B = random_floats(sb * batch, 6),
       C = random_floats(sc * batch, 7);
  auto ref = C;
  cpu().gemm_batched(false, false, M, N, K, 1.f, A.data(), K, sa, B.data(), N, sb, 0.5f, ref.data(),
                     N, sc, batch);
  DevBuf dA(A), dB(B), dC(C);
  gpu()->gemm_batched(false, false, M, N, K, 1.f, dA.f(), K, sa, dB.f(), N, sb, 0.5f, dC.f(), N, sc,
                      batch);
  EXPECT_TRUE(close_scaled(dC.get(), ref, 1e-5));
}

TEST(CudaGemm, TypedBf16AndFp8) {
  LOOM_REQUIRE_GPU();
  const int M = 64, N = 128, K = 256;
  auto A = random_floats(size_t(M) * K, 8), B = random_floats(size_t(N) * K, 9);
  // Reference: the CPU GEMM on inputs rounded to the narrow types. fp8 pairs as cuBLASLt
  // supports them (e5m2 x e5m2 is not a supported combination).
  const std::pair<DType, DType> pairs[] = {{DType::BF16, DType::BF16},
                                           {DType::F16, DType::F16},
                                           {DType::F8E4M3, DType::F8E4M3},
                                           {DType::F8E5M2, DType::F8E4M3}};
  for (auto [ta, tb] : pairs) {
    const bool fp8 = ta == DType::F8E4M3 || ta == DType::F8E5M2;
    if (fp8 && gpu()->sm_version() < 89) continue;
    auto Ar = A, Br = B;
    round_to(ta, Ar.data(), Ar.size());
    round_to(tb, Br.data(), Br.size());
    std::vector<float> ref(size_t(M) * N);
    const float sa = fp8 ? 0.5f : 1.f, sb = fp8 ? 2.f : 1.f;
    cpu().gemm(false, true, M, N, K, sa * sb, Ar.data(), K, Br.data(), K, 0.f, ref.data(), N);
    DevBuf dA32(A), dB32(B), dA(A.size() * 2), dB(B.size() * 2), dC(ref.size() * 4);
    gpu()->convert(dA.raw(), ta, dA32.raw(), DType::F32, int64_t(A.size()));
    gpu()->convert(dB.raw(), tb, dB32.raw(), DType::F32, int64_t(B.size()));
    // Each scale on its own 64-byte line, as separately allocated scale tensors are.
    std::vector<float> sc(32, 0.f);
    sc[0] = sa;
    sc[16] = sb;
    DevBuf scales(sc);
    dC.poison();
    GemmEx g;
    g.trans_b = true;
    g.M = M;
    g.N = N;
    g.K = K;
    g.a_type = ta;
    g.b_type = tb;
    g.c_type = DType::F32;
    g.A = dA.raw();
    g.lda = K;
    g.B = dB.raw();
    g.ldb = K;
    g.C = dC.raw();
    g.ldc = N;
    if (fp8) {
      g.a_scale = scales.f();
      g.b_scale = scales.f() + 16;
    }
    gpu()->gemm_ex(g);
    // Hopper's fp8 MMA keeps fewer accumulator bits than its bf16 MMA (measured here on an
    // H200: 1.7e-4 of the largest output at K = 256), hence the looser bound for fp8.
    EXPECT_TRUE(close_scaled(dC.get(), ref, fp8 ? 1e-3 : 1e-4))
        << dtype_name(ta) << " x " << dtype_name(tb);
    if (fp8) {
      // cuBLASLt refuses scales that are not 16-byte aligned at launch (seen on an H200 with a
      // scale 4 bytes after the other): the backend says so before calling it.
      g.b_scale = scales.f() + 1;
      EXPECT_THROW(
          {
            try {
              gpu()->gemm_ex(g);
            } catch (const Error& e) {
              EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos)
                  << e.what();
              throw;
            }
          },
          Error);
    }
  }
}

// ------------------------------------------------------------------------------ linear layer

TEST(CudaOps, MatmulForwardBackward) {
  LOOM_REQUIRE_GPU();
  const int N = 70, IC = 48, OC = 80;
  auto inp = random_floats(N * IC, 10), w = random_floats(OC * IC, 11), b = random_floats(OC, 12);
  auto dout = random_floats(N * OC, 13), dw0 = random_floats(OC * IC, 14),
       db0 = random_floats(OC, 15);
  for (bool bias : {false, true}) {
    std::vector<float> out(N * OC);
    cpu().matmul_forward(out.data(), inp.data(), w.data(), bias ? b.data() : nullptr, N, IC, OC);
    DevBuf di(inp), dw(w), dbb(b), dout_d(N * OC * 4);
    dout_d.poison();
    gpu()->matmul_forward(dout_d.f(), di.f(), dw.f(), bias ? dbb.f() : nullptr, N, IC, OC);
    EXPECT_TRUE(close_scaled(dout_d.get(), out, 1e-5)) << "bias=" << bias;
  }
  std::vector<float> dinp(N * IC), dw = dw0, db = db0;
  cpu().matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC,
                        OC);
  DevBuf gdi(N * IC * 4), gdw(dw0), gdb(db0), gdo(dout), gi(inp), gw(w);
  gdi.poison();
  gpu()->matmul_backward(gdi.f(), gdw.f(), gdb.f(), gdo.f(), gi.f(), gw.f(), N, IC, OC);
  EXPECT_TRUE(close_scaled(gdi.get(), dinp, 1e-5));
  EXPECT_TRUE(close_scaled(gdw.get(), dw, 1e-5));
  EXPECT_TRUE(close(gdb.get(), db, 1e-5, 1e-5));
}

// ------------------------------------------------------------------------------ embedding

TEST(CudaOps, EmbeddingForwardBackwardDeterministic) {
  LOOM_REQUIRE_GPU();
  const int V = 50, C = 96, N = 300;
  auto table = random_floats(V * C, 20);
  auto ids = random_ints(N, 21, 0, 9);  // many repeats
  auto dout = random_floats(N * C, 22), dt0 = random_floats(V * C, 23);
  DevBuf gt(table), gid(ids), gout(N * C * 4), gdo(dout);
  for (bool acc : {false, true}) {
    auto base = random_floats(N * C, 24);
    std::vector<float> out = base;
    cpu().embedding_forward(out.data(), ids.data(), table.data(), N, C, acc);
    if (acc)
      gout.set(base);
    else
      gout.poison();
    gpu()->embedding_forward(gout.f(), gid.i(), gt.f(), N, C, acc);
    EXPECT_TRUE(close(gout.get(), out, 1e-6, 0)) << "accumulate=" << acc;
  }
  std::vector<float> dt = dt0;
  cpu().embedding_backward(dt.data(), dout.data(), ids.data(), N, C);
  DevBuf gdt(dt0);
  gpu()->embedding_backward(gdt.f(), gdo.f(), gid.i(), N, C);
  auto first = gdt.get();
  EXPECT_TRUE(close(first, dt, 1e-5, 1e-5));
  gdt.set(dt0);
  gpu()->embedding_backward(gdt.f(), gdo.f(), gid.i(), N, C);
  EXPECT_TRUE(same_bits(gdt.get(), first)) << "embedding backward must be deterministic";
}

TEST(CudaOps, DeviceSideInputErrorsThrowAtSync) {
  LOOM_REQUIRE_GPU();
  std::vector<int32_t> ids = {1, -3, 2};
  DevBuf gid(ids), table(4 * 8 * 4), out(3 * 8 * 4);
  gpu()->embedding_forward(out.f(), gid.i(), table.f(), 3, 8, false);
  try {
    gpu()->sync();
    FAIL() << "negative id not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
  }
  gpu()->sync();  // the flag is cleared after being reported
  std::vector<int32_t> targets = {0, 7};
  DevBuf gtg(targets), logits(random_floats(2 * 5, 1)), losses(2 * 4);
  gpu()->cross_entropy(losses.f(), nullptr, logits.f(), gtg.i(), 2, 5, 1.f, nullptr);
  EXPECT_THROW(gpu()->sync(), Error);
}

// ------------------------------------------------------------------------------ norms

TEST(CudaOps, LayerNormForwardBackward) {
  LOOM_REQUIRE_GPU();
  for (auto [N, C] : {std::pair{37, 96}, std::pair{300, 768}, std::pair{5, 33}}) {
    auto x = random_floats(N * C, 30, -2, 3), w = random_floats(C, 31), b = random_floats(C, 32);
    auto dout = random_floats(N * C, 33), dw0 = random_floats(C, 34), db0 = random_floats(C, 35);
    std::vector<float> out(N * C), mean(N), rstd(N);
    cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                            C, 1e-5f);
    DevBuf gx(x), gw(w), gb(b), gout(N * C * 4), gm(N * 4), gr(N * 4);
    gout.poison();
    gm.poison();
    gr.poison();
    gpu()->layernorm_forward(gout.f(), gm.f(), gr.f(), gx.f(), gw.f(), gb.f(), N, C, 1e-5f);
    EXPECT_TRUE(close(gout.get(), out, 1e-4, 1e-5));
    EXPECT_TRUE(close(gm.get(), mean, 1e-4, 1e-6));
    EXPECT_TRUE(close(gr.get(), rstd, 1e-4, 0));
    // Backward in place (dinp aliases dout), as the decoder may call it.
    std::vector<float> d = dout, dw = dw0, db = db0;
    cpu().layernorm_backward(d.data(), dw.data(), db.data(), d.data(), x.data(), w.data(),
                             mean.data(), rstd.data(), N, C);
    DevBuf gd(dout), gdw(dw0), gdb(db0), gmean(mean), grstd(rstd);
    gpu()->layernorm_backward(gd.f(), gdw.f(), gdb.f(), gd.f(), gx.f(), gw.f(), gmean.f(),
                              grstd.f(), N, C);
    EXPECT_TRUE(close(gd.get(), d, 1e-4, 1e-5)) << "N=" << N << " C=" << C;
    EXPECT_TRUE(close(gdw.get(), dw, 1e-4, 1e-4));
    EXPECT_TRUE(close(gdb.get(), db, 1e-4, 1e-4));
  }
}

TEST(CudaOps, RmsNormForwardBackward) {
  LOOM_REQUIRE_GPU();
  const int N = 123, C = 256;
  auto x = random_floats(N * C, 40, -2, 2), w = random_floats(C, 41);
  auto dout = random_floats(N * C, 42), dw0 = random_floats(C, 43);
  std::vector<float> out(N * C), rstd(N);
  cpu().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  DevBuf gx(x), gw(w), gout(N * C * 4), gr(N * 4);
  gout.poison();
  gr.poison();
  gpu()->rmsnorm_forward(gout.f(), gr.f(), gx.f(), gw.f(), N, C, 1e-6f);
  EXPECT_TRUE(close(gout.get(), out, 1e-4, 1e-6));
  EXPECT_TRUE(close(gr.get(), rstd, 1e-5, 0));
  std::vector<float> dinp(N * C), dw = dw0;
  cpu().rmsnorm_backward(dinp.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N,
                         C);
  DevBuf gdi(N * C * 4), gdo(dout), gdw(dw0), grs(rstd);
  gdi.poison();
  gpu()->rmsnorm_backward(gdi.f(), gdw.f(), gdo.f(), gx.f(), gw.f(), grs.f(), N, C);
  EXPECT_TRUE(close(gdi.get(), dinp, 1e-4, 1e-5));
  EXPECT_TRUE(close(gdw.get(), dw, 1e-4, 1e-4));
}

// ------------------------------------------------------------------------------ pointwise

TEST(CudaOps, GeluSwigluAddScale) {
  LOOM_REQUIRE_GPU();
  const int N = 77, F = 130;
  const int64_t n = int64_t(N) * F;
  auto x = random_floats(n, 50, -5, 5), d = random_floats(n, 51), y = random_floats(n, 52);
  auto x2 = random_floats(2 * n, 53, -5, 5);
  DevBuf gx(x), gd(d), gy(y), gx2(x2), o(n * 4), o2(2 * n * 4);
  std::vector<float> r(n), r2(2 * n);

  cpu().gelu_forward(r.data(), x.data(), n);
  o.poison();
  gpu()->gelu_forward(o.f(), gx.f(), n);
  EXPECT_TRUE(close(o.get(), r, 1e-5, 1e-6)) << "gelu_forward";
  cpu().gelu_backward(r.data(), x.data(), d.data(), n);
  o.poison();
  gpu()->gelu_backward(o.f(), gx.f(), gd.f(), n);
  EXPECT_TRUE(close(o.get(), r, 1e-5, 1e-6)) << "gelu_backward";

  cpu().swiglu_forward(r.data(), x2.data(), N, F);
  o.poison();
  gpu()->swiglu_forward(o.f(), gx2.f(), N, F);
  EXPECT_TRUE(close(o.get(), r, 1e-5, 1e-6)) << "swiglu_forward";
  cpu().swiglu_backward(r2.data(), x2.data(), d.data(), N, F);
  o2.poison();
  gpu()->swiglu_backward(o2.f(), gx2.f(), gd.f(), N, F);
  EXPECT_TRUE(close(o2.get(), r2, 1e-5, 1e-6)) << "swiglu_backward";

  cpu().add(r.data(), x.data(), y.data(), n);
  o.poison();
  gpu()->add(o.f(), gx.f(), gy.f(), n);
  EXPECT_TRUE(close(o.get(), r, 0, 0)) << "add";
  r = x;
  cpu().add_inplace(r.data(), y.data(), n);
  cpu().scale_inplace(r.data(), 0.37f, n);
  o.set(x);
  gpu()->add_inplace(o.f(), gy.f(), n);
  gpu()->scale_inplace(o.f(), 0.37f, n);
  EXPECT_TRUE(close(o.get(), r, 0, 0)) << "add_inplace + scale_inplace";

  // LoRA dropout's mask: F = 130 columns, so rows span three 64-bit words (the last partial);
  // random bits, applied out of place and in place.
  const int64_t words = (F + 63) / 64;
  std::vector<uint64_t> bits(size_t(N * words));
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = uint64_t(uniform_at(54, i, 0) * 4294967296.0) << 32 |
              uint64_t(uniform_at(54, i, 1) * 4294967296.0);
  DevBuf gbits(bits);
  cpu().apply_bit_mask(r.data(), x.data(), bits.data(), N, F, 1.25f);
  o.poison();
  gpu()->apply_bit_mask(o.f(), gx.f(), static_cast<const uint64_t*>(gbits.raw()), N, F, 1.25f);
  EXPECT_TRUE(close(o.get(), r, 0, 0)) << "apply_bit_mask";
  o.set(x);
  gpu()->apply_bit_mask(o.f(), o.f(), static_cast<const uint64_t*>(gbits.raw()), N, F, 1.25f);
  EXPECT_TRUE(close(o.get(), r, 0, 0)) << "apply_bit_mask in place";
}

TEST(CudaOps, RopeStridedRowsRoundTrip) {
  LOOM_REQUIRE_GPU();
  const int N = 40, H = 3, D = 64, ld = H * D + 17;
  auto x = random_floats(size_t(N) * ld, 60);
  std::vector<int32_t> pos(N);
  for (int i = 0; i < N; ++i) pos[i] = (i * 977) % 5000;
  DevBuf gx(x), gp(pos);
  auto r = x;
  cpu().rope_forward(r.data(), pos.data(), N, H, D, ld, 10000.f);
  gpu()->rope_forward(gx.f(), gp.i(), N, H, D, ld, 10000.f);
  EXPECT_TRUE(close(gx.get(), r, 1e-5, 1e-5)) << "padding columns must stay untouched, too";
  cpu().rope_backward(r.data(), pos.data(), N, H, D, ld, 10000.f);
  gpu()->rope_backward(gx.f(), gp.i(), N, H, D, ld, 10000.f);
  EXPECT_TRUE(close(gx.get(), r, 1e-5, 1e-5));
  EXPECT_TRUE(close(gx.get(), x, 1e-4, 1e-5)) << "backward undoes forward";
}

TEST(CudaOps, SoftmaxForwardBackward) {
  LOOM_REQUIRE_GPU();
  const int rows = 9, cols = 1000;
  auto x = random_floats(rows * cols, 70, -8, 8), d = random_floats(rows * cols, 71);
  for (int j = 0; j < cols; ++j) x[3 * cols + j] = -INFINITY;  // fully masked row
  std::vector<float> y(rows * cols), dx(rows * cols);
  cpu().softmax_forward(y.data(), x.data(), rows, cols);
  cpu().softmax_backward(dx.data(), y.data(), d.data(), rows, cols);
  DevBuf gx(x), gd(d), gy(rows * cols * 4), gdx(rows * cols * 4);
  gy.poison();
  gdx.poison();
  gpu()->softmax_forward(gy.f(), gx.f(), rows, cols);
  EXPECT_TRUE(close(gy.get(), y, 1e-5, 1e-8));
  DevBuf gyc(y);
  gpu()->softmax_backward(gdx.f(), gyc.f(), gd.f(), rows, cols);
  EXPECT_TRUE(close(gdx.get(), dx, 1e-4, 1e-7));
}

TEST(CudaOps, CrossEntropyIgnoredTargetsAndAliasedGradient) {
  LOOM_REQUIRE_GPU();
  for (int V : {17, 1000, 50257}) {
    const int N = 6;
    auto logits = random_floats(size_t(N) * V, 80, -6, 6);
    std::vector<int32_t> t = {0, V - 1, -1, 5 % V, -1, V / 2};
    std::vector<float> losses(N), dl = logits;
    cpu().cross_entropy(losses.data(), dl.data(), dl.data(), t.data(), N, V, 0.125f, nullptr);
    DevBuf gl(logits), gt(t), gloss(N * 4);
    gloss.poison();
    gpu()->cross_entropy(gloss.f(), gl.f(), gl.f(), gt.i(), N, V, 0.125f, nullptr);
    EXPECT_TRUE(close(gloss.get(), losses, 1e-5, 1e-5)) << "V=" << V;
    EXPECT_TRUE(close(gl.get(), dl, 1e-4, 1e-9)) << "V=" << V;
    // Loss only (no gradient).
    DevBuf gl2(logits);
    gloss.poison();
    gpu()->cross_entropy(gloss.f(), nullptr, gl2.f(), gt.i(), N, V, 1.f, nullptr);
    EXPECT_TRUE(close(gloss.get(), losses, 1e-5, 1e-5));
    EXPECT_TRUE(same_bits(gl2.get(), logits)) << "logits must be left alone";
  }
}

// ------------------------------------------------------------------------------ attention

struct AttnCase {
  std::vector<int32_t> cu;
  int Hq, Hkv, D, pad;
};

// Tolerances of one attention path against the CPU backend.
struct AttnTol {
  double out_rel, out_abs, lse, dqkv;
};
constexpr AttnTol kFp32Tol{2e-4, 2e-5, 2e-5, 1e-3};

// `bf16_inputs`: q, k, v and dO are rounded to bf16 first (both sides see the same values), as
// the tensor-core kernels stage them; what remains is their rounding of P and dS.
void check_attention(const AttnCase& c, const AttnTol& tol = kFp32Tol, bool bf16_inputs = false) {
  const int nseq = int(c.cu.size()) - 1;
  const int N = c.cu.back() + 3;  // three rows after the last sequence: never touched
  const int A = c.Hq * c.D;
  const int ld = (c.Hq + 2 * c.Hkv) * c.D + c.pad;
  auto qkv = random_floats(size_t(N) * ld, 90, -2, 2);
  if (bf16_inputs) round_to(DType::BF16, qkv.data(), qkv.size());
  const float* q = qkv.data();
  const float* k = q + A;
  const float* v = k + c.Hkv * c.D;
  const float scale = 1.f / std::sqrt(float(c.D));
  auto out = test::nan_vector(size_t(N) * A), lse = test::nan_vector(size_t(N) * c.Hq);
  cpu().attention_forward(out.data(), lse.data(), q, k, v, ld, c.cu.data(), nseq, c.Hq, c.Hkv, c.D,
                          scale);
  DevBuf gqkv(qkv), gout(out.size() * 4), glse(lse.size() * 4);
  gout.poison();
  glse.poison();
  const float* gq = gqkv.f();
  const float* gk = gq + A;
  const float* gv = gk + c.Hkv * c.D;
  gpu()->attention_forward(gout.f(), glse.f(), gq, gk, gv, ld, c.cu.data(), nseq, c.Hq, c.Hkv, c.D,
                           scale);
  std::string what = "Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
                     " D=" + std::to_string(c.D) + " nseq=" + std::to_string(nseq);
  EXPECT_TRUE(close(gout.get(), out, tol.out_rel, tol.out_abs)) << "out " << what;
  EXPECT_TRUE(close(glse.get(), lse, tol.lse, tol.lse)) << "lse " << what;

  auto dout = random_floats(out.size(), 91);
  if (bf16_inputs) round_to(DType::BF16, dout.data(), dout.size());
  for (size_t i = size_t(c.cu.back()) * A; i < dout.size(); ++i) dout[i] = 0.f;
  auto dqkv = test::nan_vector(qkv.size());
  // The CPU writes every head of every row inside the sequences; padding columns stay NaN.
  cpu().attention_backward(dqkv.data(), dqkv.data() + A, dqkv.data() + A + c.Hkv * c.D, dout.data(),
                           q, k, v, out.data(), lse.data(), ld, c.cu.data(), nseq, c.Hq, c.Hkv, c.D,
                           scale);
  DevBuf gdo(dout), gdqkv(qkv.size() * 4), gout_c(out), glse_c(lse);
  gdqkv.poison();
  gpu()->attention_backward(gdqkv.f(), gdqkv.f() + A, gdqkv.f() + A + c.Hkv * c.D, gdo.f(), gq, gk,
                            gv, gout_c.f(), glse_c.f(), ld, c.cu.data(), nseq, c.Hq, c.Hkv, c.D,
                            scale);
  if (bf16_inputs)
    EXPECT_TRUE(close_scaled(gdqkv.get(), dqkv, tol.dqkv)) << "dqkv " << what;
  else
    EXPECT_TRUE(close(gdqkv.get(), dqkv, tol.dqkv, tol.dqkv / 10)) << "dqkv " << what;
}

TEST(CudaAttention, MatchesCpuAcrossShapes) {
  LOOM_REQUIRE_GPU();
  const AttnCase cases[] = {
      {{0, 200}, 4, 4, 64, 0},                      // MHA, one sequence, ragged last tile
      {{0, 100, 100, 231, 232, 500}, 4, 2, 64, 5},  // GQA, packed, empty and length-1 seqs
      {{0, 129}, 8, 1, 16, 0},                      // MQA, small head dim (DMAX 32)
      {{0, 70, 300}, 2, 2, 80, 3},                  // D padded to 128
      {{0, 96, 130}, 4, 4, 128, 0},
      {{0, 40}, 2, 1, 256, 0},
      {{7, 50, 90}, 2, 2, 32, 0},  // rows before cu[0] are left alone
  };
  for (const AttnCase& c : cases) check_attention(c);
}

// The tensor-core kernels (bf16 operands, fp32 softmax and accumulation) on every shape they
// take: ragged tiles, GQA/MQA, packed and empty sequences, padded head dims, rows before cu[0].
TEST(CudaAttention, TensorCoresMatchCpuOnBf16Inputs) {
  LOOM_REQUIRE_GPU();
  if (gpu()->sm_version() < 80) GTEST_SKIP() << "bf16 tensor cores need sm_80";
  gpu()->set_attention_math(AttnMath::BF16);
  // P and dS are rounded to bf16 (relative error 2^-9) before their products.
  const AttnTol tol{1e-2, 2e-3, 1e-4, 1e-2};
  const AttnCase cases[] = {
      {{0, 200}, 4, 4, 64, 0},      {{0, 100, 100, 231, 232, 500}, 4, 2, 64, 5},
      {{0, 129}, 8, 1, 16, 0},      {{0, 70, 300}, 2, 2, 80, 3},
      {{0, 96, 130}, 4, 4, 128, 0}, {{7, 50, 90}, 2, 2, 32, 0},
  };
  for (const AttnCase& c : cases) {
    EXPECT_TRUE(gpu()->tensor_core_attention(c.D)) << "D=" << c.D;
    check_attention(c, tol, true);
  }
  EXPECT_FALSE(gpu()->tensor_core_attention(256)) << "D=256 stays on the fp32 kernels";
  gpu()->set_attention_math(AttnMath::Auto);
}

TEST(CudaAttention, TensorCoresLongSequence) {
  LOOM_REQUIRE_GPU();
  if (gpu()->sm_version() < 80) GTEST_SKIP() << "bf16 tensor cores need sm_80";
  gpu()->set_attention_math(AttnMath::BF16);
  check_attention({{0, 1024}, 12, 12, 64, 0}, {1e-2, 2e-3, 1e-4, 1e-2}, true);
  gpu()->set_attention_math(AttnMath::Auto);
}

TEST(CudaAttention, LongSequence) {
  LOOM_REQUIRE_GPU();
  check_attention({{0, 1024}, 12, 12, 64, 0});
}

// ------------------------------------------------------------------------------ optimizer

TEST(CudaOps, AdamWSingleAndMultiTensor) {
  LOOM_REQUIRE_GPU();
  const int64_t n1 = 1000, n2 = 70000;  // n2 spans two chunks of the multi-tensor launch
  auto p1 = random_floats(n1, 100), g1 = random_floats(n1, 101), m1 = random_floats(n1, 102),
       v1 = random_floats(n1, 103, 0, 1);
  auto p2 = random_floats(n2, 104), g2 = random_floats(n2, 105), m2 = random_floats(n2, 106),
       v2 = random_floats(n2, 107, 0, 1);
  auto c1 = p1, cm1 = m1, cv1 = v1, c2 = p2, cm2 = m2, cv2 = v2;
  cpu().adamw(c1.data(), g1.data(), cm1.data(), cv1.data(), n1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
              0.5f, 7);
  cpu().adamw(c2.data(), g2.data(), cm2.data(), cv2.data(), n2, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.f,
              0.5f, 7);
  {
    DevBuf gp(p1), gg(g1), gm(m1), gv(v1);
    gpu()->adamw(gp.f(), gg.f(), gm.f(), gv.f(), n1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 7);
    EXPECT_TRUE(close(gp.get(), c1, 1e-6, 1e-7));
    EXPECT_TRUE(close(gm.get(), cm1, 1e-6, 1e-7));
    EXPECT_TRUE(close(gv.get(), cv1, 1e-6, 1e-7));
  }
  DevBuf gp1(p1), gg1(g1), gm1(m1), gv1(v1), gp2(p2), gg2(g2), gm2(m2), gv2(v2);
  gpu()->adamw_multi({{gp1.f(), gg1.f(), gm1.f(), gv1.f(), n1, 0.1f},
                      {gp2.f(), gg2.f(), gm2.f(), gv2.f(), n2, 0.f}},
                     {1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, 7});
  EXPECT_TRUE(close(gp1.get(), c1, 1e-6, 1e-7));
  EXPECT_TRUE(close(gp2.get(), c2, 1e-6, 1e-7));
  EXPECT_TRUE(close(gv2.get(), cv2, 1e-6, 1e-7));
  EXPECT_THROW(
      gpu()->adamw(gp1.f(), gg1.f(), gm1.f(), gv1.f(), n1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.f, 1.f, 0),
      Error);
}

// Backend memory (what the Decoder's arena and scratch use): stream-ordered alloc / free by
// class, copies each way, fill, and the loss sum's weighted reduction against the CPU's.
TEST(CudaOps, BackendMemoryAndWeightedSum) {
  LOOM_REQUIRE_GPU();
  Backend& be = *gpu();
  EXPECT_FALSE(be.host_accessible());
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{4099}, int64_t{70000}}) {
    auto x = random_floats(n, 120, -30, 30), w = random_floats(n, 121, -2, 2);
    BackendBuffer dx(be, n * 4, "memtest"), dw(be, n * 4, "memtest"), dy(be, n * 4, "memtest");
    for (void* p : {dx.data(), dw.data(), dy.data()}) {
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Backend::kAlign, 0u);
    }
    be.copy_h2d(dx.data(), x.data(), n * 4);
    be.copy_h2d(dw.data(), w.data(), n * 4);
    be.copy_d2d(dy.data(), dx.data(), n * 4);
    std::vector<float> back(n, -1.f);
    be.copy_d2h(back.data(), dy.data(), n * 4);
    EXPECT_EQ(back, x) << n;
    const double want_plain = cpu().weighted_sum(x.data(), nullptr, n);
    const double want = cpu().weighted_sum(x.data(), w.data(), n);
    const double got = be.weighted_sum(dx.as<float>(), dw.as<float>(), n);
    EXPECT_NEAR(be.weighted_sum(dx.as<float>(), nullptr, n), want_plain,
                1e-12 * std::max(1.0, std::abs(want_plain) + n));
    EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::abs(want) + n)) << n;
    EXPECT_EQ(be.weighted_sum(dx.as<float>(), dw.as<float>(), n), got) << "deterministic";
    be.fill_bytes(dy.data(), 0, n * 4);
    be.copy_d2h(back.data(), dy.data(), n * 4);
    be.sync();
    for (float v : back) ASSERT_EQ(v, 0.f);
  }
  EXPECT_NE(be.memory_report().find("memtest"), std::string::npos);
  int host = 0;
  EXPECT_THROW(be.free(&host), Error);
}

TEST(CudaOps, ReductionsAndRounding) {
  LOOM_REQUIRE_GPU();
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{3} << 20}) {
    auto x = random_floats(n, 110, -3, 3);
    DevBuf gx(n ? x : std::vector<float>{0.f});
    const double want = cpu().sum_squares(x.data(), n);
    const double got = gpu()->sum_squares(gx.f(), n);
    EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, want)) << n;
    EXPECT_EQ(gpu()->sum_squares(gx.f(), n), got) << "deterministic";
    EXPECT_TRUE(gpu()->all_finite(gx.f(), n));
    if (n > 1) {
      x[n / 2] = INFINITY;
      gx.set(x);
      EXPECT_FALSE(gpu()->all_finite(gx.f(), n));
      x[n / 2] = std::nanf("");
      gx.set(x);
      EXPECT_FALSE(gpu()->all_finite(gx.f(), n));
    }
  }
  auto a = random_floats(1000, 111, -1e3, 1e3), b = random_floats(500, 112);
  DevBuf ga(a), gb(b);
  EXPECT_NEAR(gpu()->sum_squares_multi({{ga.f(), 1000}, {gb.f(), 500}}),
              cpu().sum_squares(a.data(), 1000) + cpu().sum_squares(b.data(), 500), 1e-6);
  for (DType t : {DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2}) {
    auto x = random_floats(4096, 113, -600, 600);
    x[0] = 1e6f;  // saturates (fp8) / overflows to inf (fp16)
    auto r = x;
    round_to(t, r.data(), r.size());
    DevBuf gx(x);
    gpu()->round_to(t, gx.f(), int64_t(x.size()), nullptr);
    EXPECT_TRUE(same_bits(gx.get(), r)) << dtype_name(t);
  }
}

}  // namespace
}  // namespace loom
