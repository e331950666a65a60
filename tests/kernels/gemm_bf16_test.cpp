// bf16 GEMMs (kernels/cpu/gemm_bf16.h) on both paths against a float64 reference of the
// bf16 inputs.
//
// Stated tolerance, fp32 accumulation: |C - ref| <= (K + 2) * 2^-23 * sum_k |alpha a_ik b_kj|
// + 2^-22 * |beta c_ij|, the classic bound for a length-K fp32 sum in any order (products of
// bf16 values are exact in fp32), plus, for a bf16 C, half a bf16 ulp of the result.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/gemm_bf16.h"

using namespace loom;

namespace {

constexpr uint16_t kBf16NaN = 0x7fc0;
const float kNaN = std::nanf("");

enum class Path { OneDnn, Fallback };

// Selects a path for the test's lifetime; false when it is not available here.
class PathScope {
 public:
  explicit PathScope(Path p) {
    cpu::force_bf16_gemm_fallback(p == Path::Fallback);
    ok_ = p == Path::Fallback || cpu::bf16_gemm_path() == cpu::Bf16GemmPath::OneDnn;
  }
  ~PathScope() { cpu::force_bf16_gemm_fallback(false); }
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

struct Shape {
  bool ta, tb;
  int M, N, K;
  int pad;  // extra leading-dimension columns (filled with NaN: must never be read)
};

struct Operands {
  int lda, ldb, ldc;
  std::vector<uint16_t> A, B;
  std::vector<float> C0;  // initial C as fp32 (NaN in the padding, and everywhere if beta == 0)
};

Operands make_operands(const Shape& s, float beta, uint64_t seed) {
  Operands o;
  const int a_rows = s.ta ? s.K : s.M, a_cols = s.ta ? s.M : s.K;
  const int b_rows = s.tb ? s.N : s.K, b_cols = s.tb ? s.K : s.N;
  o.lda = a_cols + s.pad;
  o.ldb = b_cols + s.pad;
  o.ldc = s.N + s.pad;
  o.A.assign(size_t(a_rows) * o.lda, kBf16NaN);
  o.B.assign(size_t(b_rows) * o.ldb, kBf16NaN);
  o.C0.assign(size_t(s.M) * o.ldc, kNaN);
  for (int r = 0; r < a_rows; ++r)
    for (int c = 0; c < a_cols; ++c)
      o.A[size_t(r) * o.lda + c] = f32_to_bf16(normal_at(seed, 1, size_t(r) * a_cols + c));
  for (int r = 0; r < b_rows; ++r)
    for (int c = 0; c < b_cols; ++c)
      o.B[size_t(r) * o.ldb + c] = f32_to_bf16(normal_at(seed, 2, size_t(r) * b_cols + c));
  if (beta != 0.0f)
    for (int r = 0; r < s.M; ++r)
      for (int c = 0; c < s.N; ++c)
        o.C0[size_t(r) * o.ldc + c] = round_bf16(normal_at(seed, 3, size_t(r) * s.N + c));
  return o;
}

double a_at(const Shape& s, const Operands& o, int i, int k) {
  return bf16_to_f32(s.ta ? o.A[size_t(k) * o.lda + i] : o.A[size_t(i) * o.lda + k]);
}
double b_at(const Shape& s, const Operands& o, int k, int j) {
  return bf16_to_f32(s.tb ? o.B[size_t(j) * o.ldb + k] : o.B[size_t(k) * o.ldb + j]);
}

// Checks C (fp32 view; `bf16_c` adds half a bf16 ulp) against the float64 reference.
void expect_near_reference(const Shape& s, const Operands& o, float alpha, float beta,
                           const std::vector<float>& C, bool bf16_c, const std::string& where) {
  for (int i = 0; i < s.M; ++i) {
    for (int j = 0; j < s.N; ++j) {
      double sum = 0, abs_sum = 0;
      for (int k = 0; k < s.K; ++k) {
        const double p = a_at(s, o, i, k) * b_at(s, o, k, j);
        sum += p;
        abs_sum += std::fabs(p);
      }
      const double c0 = beta == 0.0f ? 0.0 : o.C0[size_t(i) * o.ldc + j];
      const double ref = alpha * sum + beta * c0;
      double tol = (s.K + 2) * std::ldexp(1.0, -23) * std::fabs(alpha) * abs_sum +
                   std::ldexp(1.0, -22) * std::fabs(beta * c0);
      if (bf16_c) tol += std::ldexp(std::fabs(ref) + tol, -8);
      const float got = C[size_t(i) * o.ldc + j];
      ASSERT_NEAR(got, ref, tol) << where << " at (" << i << "," << j << ")";
    }
    // Padding columns are never written.
    for (int j = s.N; j < o.ldc; ++j)
      ASSERT_TRUE(std::isnan(C[size_t(i) * o.ldc + j]))
          << where << " wrote padding (" << i << "," << j << ")";
  }
}

std::string describe(Path p, const Shape& s, float alpha, float beta, bool bf16_c) {
  return cat(p == Path::OneDnn ? "onednn" : "fallback", " ta=", s.ta, " tb=", s.tb, " M=", s.M,
             " N=", s.N, " K=", s.K, " pad=", s.pad, " alpha=", alpha, " beta=", beta,
             bf16_c ? " bf16 C" : " fp32 C");
}

// Runs one shape with fp32 and bf16 C and checks both against the reference; returns the fp32
// result for cross-path comparison.
std::vector<float> run_and_check(Path p, const Shape& s, float alpha, float beta) {
  const Operands o = make_operands(s, beta, 7 + s.M * 31 + s.N * 17 + s.K);
  std::vector<float> C = o.C0;
  cpu::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, alpha, o.A.data(), o.lda, o.B.data(), o.ldb, beta,
                 C.data(), o.ldc);
  expect_near_reference(s, o, alpha, beta, C, false, describe(p, s, alpha, beta, false));

  std::vector<uint16_t> C16(o.C0.size());
  for (size_t i = 0; i < C16.size(); ++i) C16[i] = f32_to_bf16(o.C0[i]);
  cpu::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, alpha, o.A.data(), o.lda, o.B.data(), o.ldb, beta,
                 C16.data(), o.ldc);
  std::vector<float> C16f(C16.size());
  for (size_t i = 0; i < C16.size(); ++i) C16f[i] = bf16_to_f32(C16[i]);
  expect_near_reference(s, o, alpha, beta, C16f, true, describe(p, s, alpha, beta, true));
  if (beta == 0.0f) {
    // A bf16 C is the round-to-nearest-even rounding of the fp32 result, bit for bit.
    for (int i = 0; i < s.M; ++i)
      for (int j = 0; j < s.N; ++j)
        EXPECT_EQ(C16[size_t(i) * o.ldc + j], f32_to_bf16(C[size_t(i) * o.ldc + j]))
            << describe(p, s, alpha, beta, true) << " at (" << i << "," << j << ")";
  }
  return C;
}

// Odd sizes (1, 7, 33, 1000) in every position, without any 1000 x 1000 output.
const Shape kShapes[] = {
    {false, false, 1, 1, 1, 0},     {false, false, 7, 33, 1, 2},    {false, false, 33, 7, 1000, 5},
    {false, false, 1000, 7, 33, 3}, {false, false, 7, 1000, 33, 1}, {false, false, 33, 33, 7, 9},
    {false, false, 1, 1000, 7, 4},  {false, false, 1000, 1, 33, 0},
};

void all_shapes(Path p) {
  PathScope scope(p);
  if (!scope.ok()) GTEST_SKIP() << "oneDNN path not available: " << cpu::bf16_gemm_path_name();
  for (Shape s : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        s.ta = ta;
        s.tb = tb;
        run_and_check(p, s, 1.0f, 0.0f);
        run_and_check(p, s, 1.0f, 1.0f);
        if (::testing::Test::HasFatalFailure()) return;
      }
  // Other scalings on one shape per layout.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run_and_check(p, Shape{ta, tb, 33, 7, 65, 3}, 0.5f, 0.0f);
      run_and_check(p, Shape{ta, tb, 33, 7, 65, 3}, -2.0f, 0.25f);
      // Above the single-thread threshold (2^20 multiply-adds): oneDNN splits the work.
      run_and_check(p, Shape{ta, tb, 200, 150, 64, 3}, 1.0f, 0.0f);
      run_and_check(p, Shape{ta, tb, 200, 150, 64, 3}, 1.0f, 1.0f);
    }
}

}  // namespace

TEST(GemmBf16, OneDnnPathMatchesFloat64Reference) {
  all_shapes(Path::OneDnn);
}

TEST(GemmBf16, FallbackPathMatchesFloat64Reference) {
  all_shapes(Path::Fallback);
}

TEST(GemmBf16, PathsAgreeUpToSummationOrder) {
  {
    PathScope probe(Path::OneDnn);
    if (!probe.ok()) GTEST_SKIP() << "oneDNN path not available: " << cpu::bf16_gemm_path_name();
  }
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Shape s{ta, tb, 64, 96, 768, 0};
      const Operands o = make_operands(s, 1.0f, 99);
      std::vector<float> by_path[2];
      for (Path p : {Path::OneDnn, Path::Fallback}) {
        PathScope scope(p);
        auto& C = by_path[p == Path::OneDnn ? 0 : 1];
        C = o.C0;
        cpu::gemm_bf16(ta, tb, s.M, s.N, s.K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb, 1.0f,
                       C.data(), o.ldc);
      }
      for (size_t i = 0; i < by_path[0].size(); ++i) {
        // Twice the reference bound with the bf16 products' magnitude bounded by the inputs'.
        double abs_sum = 0;
        const int r = int(i) / o.ldc, c = int(i) % o.ldc;
        for (int k = 0; k < s.K; ++k) abs_sum += std::fabs(a_at(s, o, r, k) * b_at(s, o, k, c));
        const double tol = 2 * (s.K + 2) * std::ldexp(abs_sum + std::fabs(o.C0[i]), -23);
        ASSERT_NEAR(by_path[0][i], by_path[1][i], tol) << "ta=" << ta << " tb=" << tb << " " << i;
      }
    }
}

TEST(GemmBf16, BatchedMatchesReferenceOnBothPaths) {
  for (Path p : {Path::OneDnn, Path::Fallback}) {
    PathScope scope(p);
    if (!scope.ok()) continue;
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool shared_b : {false, true}) {
          const int batch = 3;
          const Shape s{ta, tb, 17, 9, 40, 2};
          // One Operands per batch entry, laid out back to back with a gap between matrices.
          std::vector<Operands> parts;
          for (int b = 0; b < batch; ++b) parts.push_back(make_operands(s, 1.0f, 500 + b));
          if (shared_b)
            for (auto& part : parts) part.B = parts[0].B;
          const int64_t sa = parts[0].A.size() + 4, sb = shared_b ? 0 : parts[0].B.size() + 4,
                        sc = parts[0].C0.size() + 4;
          std::vector<uint16_t> A(sa * batch, kBf16NaN),
              B(shared_b ? parts[0].B.size() : sb * batch, kBf16NaN);
          std::vector<float> C(sc * batch, kNaN);
          std::vector<uint16_t> C16(sc * batch, kBf16NaN);
          for (int b = 0; b < batch; ++b) {
            std::copy(parts[b].A.begin(), parts[b].A.end(), A.begin() + b * sa);
            std::copy(parts[b].B.begin(), parts[b].B.end(), B.begin() + b * sb);
            std::copy(parts[b].C0.begin(), parts[b].C0.end(), C.begin() + b * sc);
            for (size_t i = 0; i < parts[b].C0.size(); ++i)
              C16[b * sc + i] = f32_to_bf16(parts[b].C0[i]);
          }
          const auto& o = parts[0];
          cpu::gemm_bf16_batched(ta, tb, s.M, s.N, s.K, 0.5f, A.data(), o.lda, sa, B.data(), o.ldb,
                                 sb, 1.0f, C.data(), o.ldc, sc, batch);
          cpu::gemm_bf16_batched(ta, tb, s.M, s.N, s.K, 0.5f, A.data(), o.lda, sa, B.data(), o.ldb,
                                 sb, 1.0f, C16.data(), o.ldc, sc, batch);
          for (int b = 0; b < batch; ++b) {
            const std::string where =
                cat(describe(p, s, 0.5f, 1.0f, false), " batch ", b, shared_b ? " shared B" : "");
            std::vector<float> Cb(C.begin() + b * sc, C.begin() + b * sc + o.C0.size());
            expect_near_reference(s, parts[b], 0.5f, 1.0f, Cb, false, where);
            std::vector<float> C16b(o.C0.size());
            for (size_t i = 0; i < C16b.size(); ++i) C16b[i] = bf16_to_f32(C16[b * sc + i]);
            expect_near_reference(s, parts[b], 0.5f, 1.0f, C16b, true, where + " bf16 C");
            // The gap between matrices is never written.
            for (int64_t i = o.C0.size(); i < sc; ++i) ASSERT_TRUE(std::isnan(C[b * sc + i]));
          }
        }
  }
}

TEST(GemmBf16, EmptyInnerDimensionScalesC) {
  for (Path p : {Path::OneDnn, Path::Fallback}) {
    PathScope scope(p);
    if (!scope.ok()) continue;
    std::vector<float> C = {1.0f, -2.0f, 3.0f, 4.0f};
    cpu::gemm_bf16(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 2.0f, C.data(), 2);
    EXPECT_EQ(C, (std::vector<float>{2.0f, -4.0f, 6.0f, 8.0f}));
    std::vector<uint16_t> C16 = {kBf16NaN, kBf16NaN};
    cpu::gemm_bf16(false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, C16.data(), 2);
    EXPECT_EQ(C16, (std::vector<uint16_t>{0, 0}));
  }
}

TEST(GemmBf16, BadArgumentsThrow) {
  std::vector<uint16_t> A(64), B(64);
  std::vector<float> C(64);
  EXPECT_THROW(
      cpu::gemm_bf16(false, false, -1, 2, 2, 1.0f, A.data(), 2, B.data(), 2, 0.0f, C.data(), 2),
      Error);
  EXPECT_THROW(
      cpu::gemm_bf16(false, false, 2, 2, 4, 1.0f, A.data(), 3, B.data(), 2, 0.0f, C.data(), 2),
      Error);  // lda < K
  EXPECT_THROW(
      cpu::gemm_bf16(false, true, 2, 4, 2, 1.0f, A.data(), 2, B.data(), 1, 0.0f, C.data(), 4),
      Error);  // ldb < K for a transposed B
  EXPECT_THROW(
      cpu::gemm_bf16(false, false, 2, 4, 2, 1.0f, A.data(), 2, B.data(), 4, 0.0f, C.data(), 3),
      Error);  // ldc < N
  EXPECT_THROW(cpu::gemm_bf16_batched(false, false, 2, 2, 2, 1.0f, A.data(), 2, 4, B.data(), 2, 4,
                                      0.0f, C.data(), 2, 3, 2),
               Error);  // C matrices overlap
}

TEST(GemmBf16, PathChoiceFollowsBuildAndCpu) {
  const std::string name = cpu::bf16_gemm_path_name();
  if (std::getenv("LOOM_BF16_GEMM") != nullptr) GTEST_SKIP() << "LOOM_BF16_GEMM is set";
  const bool want_onednn = cpu::bf16_gemm_onednn_built() && cpu::cpu_has_avx512_bf16();
  EXPECT_EQ(cpu::bf16_gemm_path() == cpu::Bf16GemmPath::OneDnn, want_onednn) << name;
  EXPECT_EQ(name == "onednn", want_onednn) << name;
  cpu::force_bf16_gemm_fallback(true);
  EXPECT_EQ(cpu::bf16_gemm_path(), cpu::Bf16GemmPath::Fallback);
  EXPECT_EQ(std::string(cpu::bf16_gemm_path_name()), "fallback (forced)");
  cpu::force_bf16_gemm_fallback(false);
}

// Registered a second time in CMake with LOOM_BF16_GEMM=fallback in the environment.
TEST(GemmBf16Env, FallbackForcedByEnvironment) {
  const char* env = std::getenv("LOOM_BF16_GEMM");
  if (env == nullptr || std::string(env) != "fallback") GTEST_SKIP() << "LOOM_BF16_GEMM unset";
  EXPECT_EQ(cpu::bf16_gemm_path(), cpu::Bf16GemmPath::Fallback);
  EXPECT_EQ(std::string(cpu::bf16_gemm_path_name()), "fallback (LOOM_BF16_GEMM=fallback)");
  // And the GEMM still computes.
  const uint16_t one = f32_to_bf16(1.0f), two = f32_to_bf16(2.0f);
  const uint16_t A[2] = {one, two}, B[2] = {two, one};
  float C = 0.0f;
  cpu::gemm_bf16(false, false, 1, 1, 2, 1.0f, A, 2, B, 1, 0.0f, &C, 1);
  EXPECT_EQ(C, 4.0f);
}

TEST(GemmBf16, SmallGemmsLeaveTheThreadCountAsSet) {
  // Small GEMMs run oneDNN on one thread by lowering the OpenMP thread count for the call.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(3);
  const Shape s{false, true, 8, 8, 8, 0};
  const Operands o = make_operands(s, 0.0f, 5);
  std::vector<float> C = o.C0;
  cpu::gemm_bf16(false, true, 8, 8, 8, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.0f, C.data(),
                 o.ldc);
  EXPECT_EQ(omp_get_max_threads(), 3);
  omp_set_num_threads(saved);
  expect_near_reference(s, o, 1.0f, 0.0f, C, false, "8x8x8");
}

// The weight-gradient layout (C[M,N] = alpha A^T B + beta C, fp32 C) above the single-thread
// threshold runs in blocks of C's rows, one single-threaded oneDNN matmul each, accumulating
// through a scratch block when beta != 0: checked against the reference at both block sizes
// (128 and 256 rows) with a partial last block and padded leading dimensions, and bit-identical
// for 1, 2 and 3 threads (the blocks do not depend on the thread count).
TEST(GemmBf16, WeightGradientBlocksMatchReferenceOnAnyThreadCount) {
  PathScope scope(Path::OneDnn);
  if (!scope.ok()) GTEST_SKIP() << "oneDNN path not available: " << cpu::bf16_gemm_path_name();
  const int saved = omp_get_max_threads();
  for (const Shape& s : {Shape{true, false, 1000, 150, 64, 3}, Shape{true, false, 3100, 40, 33, 1}})
    for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {1.0f, 1.0f}, {-2.0f, 0.25f}}) {
      const Operands o = make_operands(s, beta, 5 + s.M);
      std::vector<float> by_threads[3];
      for (int t = 1; t <= 3; ++t) {
        omp_set_num_threads(t);
        std::vector<float>& C = by_threads[t - 1];
        C = o.C0;
        cpu::gemm_bf16(true, false, s.M, s.N, s.K, alpha, o.A.data(), o.lda, o.B.data(), o.ldb,
                       beta, C.data(), o.ldc);
        expect_near_reference(s, o, alpha, beta, C, false,
                              cat(describe(Path::OneDnn, s, alpha, beta, false), " threads=", t));
        if (::testing::Test::HasFatalFailure()) break;
      }
      omp_set_num_threads(saved);
      for (int t = 2; t <= 3; ++t) {
        for (size_t i = 0; i < o.C0.size(); ++i) {
          if (std::isnan(by_threads[0][i])) continue;  // the padding stays NaN
          ASSERT_EQ(by_threads[t - 1][i], by_threads[0][i])
              << describe(Path::OneDnn, s, alpha, beta, false) << " threads=" << t << " at " << i;
        }
      }
    }
}

// gemm_bf16_reused_b: the plain GEMM's bits on every call of a version (the first reads the plain
// B, the second packs it, the later ones reuse the packed copy), and a new version after B
// changed reads the new values (a packed copy kept across versions would not).
TEST(GemmBf16, ReusedBEqualsPlainGemmAcrossVersions) {
  for (Path p : {Path::OneDnn, Path::Fallback}) {
    PathScope scope(p);
    if (!scope.ok()) continue;
    const int M = 5, N = 40, K = 3000;
    std::vector<uint16_t> A(size_t(M) * K), B(size_t(K) * N);
    auto fill = [](std::vector<uint16_t>& x, uint64_t seed) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(normal_at(seed, 1, i));
    };
    fill(A, 1);
    int key = 0;  // any address names the cache entry
    for (uint64_t version : {1, 2, 3}) {
      fill(B, 10 + version);
      std::vector<float> want(size_t(M) * N), got(size_t(M) * N, kNaN);
      cpu::gemm_bf16(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, want.data(), N);
      for (int call = 0; call < 3; ++call) {
        std::fill(got.begin(), got.end(), kNaN);
        cpu::gemm_bf16_reused_b(M, N, K, A.data(), K, B.data(), N, got.data(), N, &key, version);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(f32_bits(want[i]), f32_bits(got[i]))
              << (p == Path::OneDnn ? "onednn" : "fallback") << " version " << version << " call "
              << call << " element " << i;
      }
    }
    cpu::gemm_bf16_release(&key);
    cpu::gemm_bf16_release(&key);  // nothing kept: a no-op
  }
}

// The linear forward with its bias added in the kernel (gemm_bf16_bias) against a float64
// reference, on both paths, at a K oneDNN may split (3072) and one it does not: the error bound
// of the plain GEMM with the bias as one more term. Padding columns of C stay untouched.
TEST(GemmBf16, BiasInTheKernelMatchesReferenceOnBothPaths) {
  for (Path p : {Path::OneDnn, Path::Fallback}) {
    PathScope scope(p);
    if (!scope.ok()) continue;
    for (const Shape& s :
         {Shape{false, true, 37, 80, 768, 3}, Shape{false, true, 64, 48, 3072, 0}}) {
      const Operands o = make_operands(s, 0.f, 5);
      std::vector<float> bias(size_t(s.N));
      for (int j = 0; j < s.N; ++j) bias[size_t(j)] = 4.f * (uniform_at(5, 9, uint64_t(j)) - 0.5f);
      std::vector<float> C = o.C0;
      for (int r = 0; r < s.M; ++r)  // padding marked, to catch a write there
        for (int j = s.N; j < o.ldc; ++j) C[size_t(r) * o.ldc + j] = 123.f;
      cpu::gemm_bf16_bias(s.M, s.N, s.K, o.A.data(), o.lda, o.B.data(), o.ldb, bias.data(),
                          C.data(), o.ldc);
      for (int r = 0; r < s.M; ++r) {
        for (int j = 0; j < s.N; ++j) {
          double ref = bias[size_t(j)], abs_sum = std::fabs(bias[size_t(j)]);
          for (int k = 0; k < s.K; ++k) {
            ref += double(a_at(s, o, r, k)) * b_at(s, o, k, j);
            abs_sum += std::fabs(double(a_at(s, o, r, k)) * b_at(s, o, k, j));
          }
          const double tol = (s.K + 2) * std::ldexp(abs_sum, -23);
          ASSERT_NEAR(C[size_t(r) * o.ldc + j], ref, tol)
              << (p == Path::OneDnn ? "onednn" : "fallback") << " K=" << s.K << " " << r << ","
              << j;
        }
        for (int j = s.N; j < o.ldc; ++j) ASSERT_EQ(C[size_t(r) * o.ldc + j], 123.f);
      }
    }
  }
}

// gemm_bf16_varying_alpha on the oneDNN path: the GEMM with alpha 1 (S), then fl(alpha * S)
// plus the bias or C, each step rounded to fp32 (no fused multiply-add); on the fallback,
// gemm_bf16 with that alpha. Shapes: the linear forward with a bias, dgrad, the weight-gradient
// blocks with beta 0 and 1, and a small accumulating GEMM below the blocks' threshold. On the
// oneDNN path a new alpha creates no primitive.
TEST(GemmBf16, VaryingAlphaScalesTheUnscaledGemm) {
  struct Case {
    Shape s;
    float beta;
    bool bias;
  };
  const Case cases[] = {
      {{false, true, 64, 300, 768, 3}, 0.f, true},   {{false, true, 37, 80, 96, 0}, 0.f, false},
      {{false, false, 64, 200, 300, 2}, 0.f, false}, {{true, false, 1000, 150, 64, 3}, 0.f, false},
      {{true, false, 1000, 150, 64, 3}, 1.f, false}, {{true, false, 20, 30, 40, 1}, 1.f, false}};
  for (Path p : {Path::OneDnn, Path::Fallback}) {
    PathScope scope(p);
    if (!scope.ok()) continue;
    for (const Case& c : cases) {
      const Shape& s = c.s;
      const Operands o = make_operands(s, c.beta, 7 + s.M);
      std::vector<float> bias(size_t(s.N));
      for (int j = 0; j < s.N; ++j) bias[size_t(j)] = 4.f * (uniform_at(7, 9, uint64_t(j)) - 0.5f);
      std::vector<float> unscaled = o.C0;
      cpu::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.f,
                     unscaled.data(), o.ldc);
      uint64_t created = 0;
      int call = 0;
      for (float alpha : {1.f, 1.f / (3.7f * 11.3f), 0.0171f, 2.5e3f}) {
        std::vector<float> want = o.C0, got = o.C0;
        if (p == Path::OneDnn) {
          for (int r = 0; r < s.M; ++r)
            for (int j = 0; j < s.N; ++j) {
              const size_t i = size_t(r) * o.ldc + j;
              // (volatile: the product rounded, never fused with the addition by the compiler)
              const volatile float scaled = alpha * unscaled[i];
              want[i] = scaled + (c.bias ? bias[size_t(j)] : c.beta != 0.f ? o.C0[i] : 0.f);
            }
        } else {
          if (c.bias)
            for (int r = 0; r < s.M; ++r)
              std::copy(bias.begin(), bias.end(), want.begin() + int64_t(r) * o.ldc);
          cpu::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, alpha, o.A.data(), o.lda, o.B.data(), o.ldb,
                         c.bias ? 1.f : c.beta, want.data(), o.ldc);
        }
        const uint64_t before = cpu::bf16_gemm_primitives_created();
        cpu::gemm_bf16_varying_alpha(s.ta, s.tb, s.M, s.N, s.K, alpha, o.A.data(), o.lda,
                                     o.B.data(), o.ldb, c.beta, got.data(), o.ldc,
                                     c.bias ? bias.data() : nullptr);
        created += call++ == 0 ? 0 : cpu::bf16_gemm_primitives_created() - before;
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(f32_bits(want[i]), f32_bits(got[i]))
              << describe(p, s, alpha, c.beta, false) << " bias=" << c.bias << " at " << i;
      }
      EXPECT_EQ(created, 0u) << describe(p, s, 0.f, c.beta, false)
                             << ": primitives created for new alphas";
    }
  }
}
