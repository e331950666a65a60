// Weight-only bf16 / int8 / fp8 linear layers (serving): against a double-precision reference on
// the same (rounded) weights, the AVX-512 and scalar loops bit for bit, rows independent of the
// batch and of the thread count, int8 and fp8 quantisation's bounds, and every fp8 code decoded
// exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm_lowp.h"
#include "kernels/cpu/gemm_lowp_amx.h"
#include "kernels/cpu/gemm_lowp_pages.h"

using namespace loom;
using namespace loom::cpu;

namespace {

std::vector<float> randn(size_t n, uint64_t key, float std = 1.f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std * normal_at(7, key, i);
  return v;
}

// y = x W^T + b in double from fp32 weights (already rounded or dequantised), with the error
// bound of fp32 accumulation: |y - ref| <= 2 K eps sum_k |x w| (+ rounding of the bias).
void check_against_reference(const std::vector<float>& y, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<float>& b, int M, int K,
                             int N) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = b.empty() ? 0 : b[size_t(n)], mag = std::fabs(ref);
      for (int k = 0; k < K; ++k) {
        const double p = double(x[size_t(m) * K + k]) * w[size_t(n) * K + k];
        ref += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(y[size_t(m) * N + n], ref, 2.0 * K * 1.2e-7 * mag + 1e-30)
          << "m " << m << " n " << n << " M " << M << " K " << K;
    }
}

struct Restore {
  bool avx = lowp_uses_avx512(), vbmi = lowp_uses_vbmi(), amx = lowp_uses_amx();
  ~Restore() {
    set_lowp_avx512(avx);
    set_lowp_vbmi(vbmi);
    set_lowp_amx(amx);
  }
};

}  // namespace

TEST(GemmLowp, Bf16WeightsMatchTheReferenceOnRoundedWeights) {
  for (int M : {1, 3, 9, 16, 17, 40})
    for (int K : {37, 64, 200})
      for (int N : {5, 33}) {
        std::vector<float> x = randn(size_t(M) * K, 1), w = randn(size_t(N) * K, 2, 0.1f),
                           b = randn(size_t(N), 3);
        std::vector<uint16_t> wb(w.size());
        for (size_t i = 0; i < w.size(); ++i) {
          wb[i] = f32_to_bf16(w[i]);
          w[i] = bf16_to_f32(wb[i]);
        }
        std::vector<float> y(size_t(M) * N, -1.f);
        gemv_f32w(y.data(), x.data(), w.data(), b.data(), M, K, N);  // fp32 weights, any M
        check_against_reference(y, x, w, b, M, K, N);
        linear_bf16w(y.data(), x.data(), wb.data(), b.data(), M, K, N);
        check_against_reference(y, x, w, b, M, K, N);
        linear_bf16w(y.data(), x.data(), wb.data(), nullptr, M, K, N);
        check_against_reference(y, x, w, {}, M, K, N);
      }
}

TEST(GemmLowp, Int8QuantisationIsBoundedAndTheProductMatchesTheReference) {
  const int N = 19, K = 130;
  std::vector<float> w = randn(size_t(N) * K, 4, 0.05f);
  for (int k = 0; k < K; ++k) w[size_t(3) * K + k] = 0;  // an all-zero row: scale 1, q 0
  std::vector<int8_t> q(w.size());
  std::vector<float> s(static_cast<size_t>(N));
  quantize_int8_rows(w.data(), N, K, q.data(), s.data());
  EXPECT_EQ(s[3], 1.f);
  std::vector<float> deq(w.size());
  for (int n = 0; n < N; ++n) {
    float mx = 0;
    for (int k = 0; k < K; ++k) mx = std::max(mx, std::fabs(w[size_t(n) * K + k]));
    if (n != 3) {
      EXPECT_FLOAT_EQ(s[size_t(n)], mx / 127);
    }
    for (int k = 0; k < K; ++k) {
      const size_t i = size_t(n) * K + k;
      ASSERT_LE(std::abs(int(q[i])), 127);
      deq[i] = s[size_t(n)] * q[i];
      ASSERT_LE(std::fabs(deq[i] - w[i]), 0.5f * s[size_t(n)] * 1.0001f);
    }
  }
  for (int M : {1, 7, 16, 33}) {
    std::vector<float> x = randn(size_t(M) * K, 5), b = randn(size_t(N), 6);
    std::vector<float> y(size_t(M) * N);
    linear_int8w(y.data(), x.data(), q.data(), s.data(), b.data(), M, K, N);
    // The scale multiplies the finished sum: one more rounding than the reference's.
    check_against_reference(y, x, deq, b, M, K, N);
  }
}

// The AVX-512 kernel works on tiles (8 or 4 rows of one input; 4 rows of up to 4 inputs; then
// single rows) that must each sum in the scalar loop's order: every M of a decode batch, row counts
// with every tail, K with and without a tail, every weight type; and prefill chunks (M 17, 33)
// widen their weight blocks to the same values.
TEST(GemmLowp, Avx512AndScalarLoopsGiveTheSameBits) {
  Restore restore;
  if (!lowp_uses_avx512()) GTEST_SKIP() << "this CPU has no AVX-512";
  set_lowp_amx(false);          // (the tile path sums in its own order: GemmLowpAmx below)
  for (int K : {32, 301, 317})  // 317: fp8's 32-wide steps, then one of 16, then the tail
    for (int N : {1, 7, 13, 40}) {
      const int M = 2 * kLowpGemvRows + 1;  // then prefill chunks: blocks widened for the BLAS
      std::vector<float> x = randn(size_t(M) * K, 8), w = randn(size_t(N) * K, 9), b = randn(N, 10);
      std::vector<uint16_t> wb(w.size());
      for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
      std::vector<int8_t> q(w.size());
      std::vector<uint8_t> f8(w.size());
      std::vector<float> s(static_cast<size_t>(N)), s8(s.size());
      ASSERT_TRUE(quantize_int8_rows(w.data(), N, K, q.data(), s.data()));
      ASSERT_TRUE(quantize_fp8_rows(w.data(), N, K, f8.data(), s8.data()));
      for (int m = 1; m <= M; m += m < kLowpGemvRows ? 1 : kLowpGemvRows) {
        std::vector<float> got[4], want[4];
        for (bool avx : {true, false}) {
          set_lowp_avx512(avx);
          std::vector<float>* out = avx ? got : want;
          for (int t = 0; t < 4; ++t) out[t].assign(size_t(m) * N, 0.f);
          gemv_f32w(out[0].data(), x.data(), w.data(), b.data(), m, K, N);
          linear_bf16w(out[1].data(), x.data(), wb.data(), b.data(), m, K, N);
          linear_int8w(out[2].data(), x.data(), q.data(), s.data(), b.data(), m, K, N);
          linear_fp8w(out[3].data(), x.data(), f8.data(), s8.data(), nullptr, m, K, N);
        }
        set_lowp_avx512(true);
        for (int t = 0; t < 4; ++t)
          ASSERT_EQ(got[t], want[t]) << "type " << t << " M " << m << " K " << K << " N " << N;
      }
    }
}

// fp8's single-input GEMV by byte permutes (AVX512_VBMI) against the AVX512BW steps and the
// scalar loop: the same bits for every code (the NaN codes, which quantize_fp8_rows never
// writes, included: all three read them alike), K
// with 64-wide steps then 32- and 16-wide ones and a tail, row counts around the 8-row tile.
TEST(GemmLowp, Fp8ByPermutesGivesTheSameBitsAsTheOtherLoops) {
  Restore restore;
  set_lowp_vbmi(true);
  if (!lowp_uses_vbmi()) GTEST_SKIP() << "this CPU has no AVX512_VBMI";
  for (int K : {64, 256, 317, 768})
    for (int N : {8, 13, 40}) {
      std::vector<uint8_t> q(size_t(N) * K);
      for (size_t i = 0; i < q.size(); ++i)  // every code, in an order that differs row by row
        q[i] = uint8_t(i * 7 + i / size_t(K) * 31);
      std::vector<float> x = randn(size_t(K), 20), s = randn(size_t(N), 21), b = randn(N, 22);
      std::vector<float> got[3];
      for (int path = 0; path < 3; ++path) {  // permutes, AVX512BW steps, scalar
        set_lowp_avx512(path < 2);
        set_lowp_vbmi(path == 0);
        got[path].assign(size_t(N), 0.f);
        linear_fp8w(got[path].data(), x.data(), q.data(), s.data(), b.data(), 1, K, N);
      }
      set_lowp_avx512(true);
      set_lowp_vbmi(true);
      for (int n = 0; n < N; ++n) EXPECT_TRUE(std::isfinite(got[0][size_t(n)])) << n;
      ASSERT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
          << "K " << K << " N " << N;
      ASSERT_EQ(std::memcmp(got[0].data(), got[2].data(), got[0].size() * sizeof(float)), 0)
          << "K " << K << " N " << N;
    }
}

// A decode's logits must not depend on what else is batched (seeded sampling) nor on threads:
// the GEMV's rows (on AMX CPUs batches of kAmxMinRows or more take the tile path, whose rows are
// the same for every such batch: GemmLowpAmx.RowsDoNotDependOnTheBatchOrThreads).
TEST(GemmLowp, RowsDoNotDependOnTheBatchOrThreads) {
  Restore restore;
  set_lowp_amx(false);
  const int M = 16, K = 96, N = 70000 / 96;  // past the threshold that splits rows over threads
  std::vector<float> x = randn(size_t(M) * K, 11), w = randn(size_t(N) * K, 12);
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  std::vector<float> all(size_t(M) * N), one(static_cast<size_t>(N));
  linear_bf16w(all.data(), x.data(), wb.data(), nullptr, M, K, N);
  for (int m : {0, 5, 15}) {
    linear_bf16w(one.data(), x.data() + size_t(m) * K, wb.data(), nullptr, 1, K, N);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + long(m) * N)) << m;
  }
  const int t = num_threads();
  set_num_threads(1);
  std::vector<float> serial(all.size());
  linear_bf16w(serial.data(), x.data(), wb.data(), nullptr, M, K, N);
  set_num_threads(t);
  EXPECT_EQ(serial, all);
}

// fp32 weights: batches of kF32BatchMinRows inputs or more take their own block (8 rows, inputs
// 3 at a time, the lanes reduced 16 outputs at once), which must sum every output in the order
// of the single-input tiles: each row of every batch M 2..kLowpGemvRows (and past it, as
// gemv_f32w serves any M) equals that input alone (M = 1) bit for bit, at 1 and 2 threads, with
// K at the model's widths (with and without a tail) and row counts whose blocks leave
// remainders at each thread's end.
TEST(GemmLowp, F32BatchRowsEqualTheInputAloneBitForBit) {
  const int t = num_threads();
  for (int K : {768, 3072 + 5})
    for (int N : {45, 2304 / 8 + 3}) {
      const int M = 2 * kLowpGemvRows + 3;
      std::vector<float> x = randn(size_t(M) * K, 30), w = randn(size_t(N) * K, 31, 0.05f),
                         b = randn(size_t(N), 32);
      std::vector<float> alone(size_t(M) * N);
      for (int m = 0; m < M; ++m)
        gemv_f32w(alone.data() + size_t(m) * N, x.data() + size_t(m) * K, w.data(), b.data(), 1, K,
                  N);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        for (int batch = 2; batch <= M; ++batch) {
          std::vector<float> y(size_t(batch) * N);
          gemv_f32w(y.data(), x.data(), w.data(), b.data(), batch, K, N);
          ASSERT_EQ(std::memcmp(y.data(), alone.data(), y.size() * sizeof(float)), 0)
              << "M " << batch << " K " << K << " N " << N << " threads " << threads;
        }
      }
      set_num_threads(t);
    }
}

// fp8 weights: every E4M3 code but the NaNs, read through one-hot inputs, gives exactly the
// value fp8.h decodes (GEMV rows and the blocked GEMM, AVX-512 and scalar alike), times its
// row's scale.
TEST(GemmLowp, Fp8WeightsDecodeEveryCodeExactly) {
  Restore restore;
  const int K = 256, N = 2;
  std::vector<uint8_t> q(size_t(N) * K);
  for (int k = 0; k < K; ++k) {
    const uint8_t c = (k & 0x7F) == 0x7F ? 0 : uint8_t(k);  // no NaN codes
    q[size_t(k)] = c;
    q[size_t(K + k)] = c;
  }
  const std::vector<float> s = {1.f, 0.375f};
  std::vector<float> x(size_t(K) * K, 0.f);
  for (int k = 0; k < K; ++k) x[size_t(k) * K + k] = 1.f;
  for (bool avx : {true, false}) {
    set_lowp_avx512(avx);
    std::vector<float> y(size_t(K) * N);
    for (int m0 = 0; m0 < K; m0 += kLowpGemvRows)  // decode batches: the GEMV kernel
      linear_fp8w(y.data() + size_t(m0) * N, x.data() + size_t(m0) * K, q.data(), s.data(), nullptr,
                  kLowpGemvRows, K, N);
    std::vector<float> blocked(y.size());  // a prefill chunk: widened rows and the BLAS
    linear_fp8w(blocked.data(), x.data(), q.data(), s.data(), nullptr, K, K, N);
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) {
        const float want = s[size_t(n)] * fp8_decode(Fp8Format::E4M3, q[size_t(n) * K + k]);
        ASSERT_EQ(y[size_t(k) * N + n], want) << "code " << k << " avx " << avx;
        ASSERT_EQ(blocked[size_t(k) * N + n], want) << "code " << k << " avx " << avx;
      }
  }
}

// Per-row E4M3: the row's largest magnitude becomes 448 (code 0x7E), every weight is within
// E4M3's half step (2^-4 relative, or half the subnormal step 2^-10 of the scaled value) of the
// original, the product matches the reference on the dequantised weights, and a non-finite row is
// refused; the AVX-512 and scalar loops give the same bits.
TEST(GemmLowp, Fp8QuantisationIsBoundedAndTheProductMatchesTheReference) {
  Restore restore;
  const int M = 5, K = 67, N = 9;
  std::vector<float> x = randn(size_t(M) * K, 21), w = randn(size_t(N) * K, 22, 0.05f),
                     b = randn(N, 23);
  std::fill(w.begin() + 3 * K, w.begin() + 4 * K, 0.f);  // an all-zero row: scale 1
  std::vector<uint8_t> q(w.size());
  std::vector<float> s(static_cast<size_t>(N));
  ASSERT_TRUE(quantize_fp8_rows(w.data(), N, K, q.data(), s.data()));
  EXPECT_EQ(s[3], 1.f);
  std::vector<float> deq(w.size());
  for (int n = 0; n < N; ++n) {
    float mx = 0;
    for (int k = 0; k < K; ++k) mx = std::max(mx, std::fabs(w[size_t(n) * K + k]));
    bool has_max = false;
    for (int k = 0; k < K; ++k) {
      const size_t i = size_t(n) * K + k;
      deq[i] = s[size_t(n)] * fp8_decode(Fp8Format::E4M3, q[i]);
      const double scaled = std::fabs(w[i]) / s[size_t(n)];
      EXPECT_LE(std::fabs(deq[i] - w[i]) / s[size_t(n)], std::max(scaled / 16, 0x1p-10) * 1.0001)
          << "row " << n << " k " << k;
      has_max |= mx > 0 && (q[i] & 0x7F) == 0x7E;
    }
    EXPECT_TRUE(has_max || mx == 0) << "row " << n;
  }
  for (int Mx : {M, 40}) {  // GEMV and blocked paths
    std::vector<float> xx = randn(size_t(Mx) * K, 24), y(size_t(Mx) * N);
    linear_fp8w(y.data(), xx.data(), q.data(), s.data(), b.data(), Mx, K, N);
    check_against_reference(y, xx, deq, b, Mx, K, N);
  }
  if (lowp_uses_avx512()) {
    std::vector<float> a(size_t(M) * N), c(a.size());
    linear_fp8w(a.data(), x.data(), q.data(), s.data(), b.data(), M, K, N);
    set_lowp_avx512(false);
    linear_fp8w(c.data(), x.data(), q.data(), s.data(), b.data(), M, K, N);
    EXPECT_EQ(a, c);
  }
  w[size_t(7) * K + 5] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(quantize_fp8_rows(w.data(), N, K, q.data(), s.data()));
}

// A row split by columns (a row-parallel tensor-parallel shard): each part quantised with the
// whole row's largest magnitude gives exactly the whole row's codes and scale. With its own
// maximum a part would not (the check below that it differs keeps this test able to fail).
TEST(GemmLowp, RowPartsQuantisedWithTheWholeRowsMaximumEqualTheWholeRow) {
  const int N = 11, K = 96, half = K / 2;
  std::vector<float> w = randn(size_t(N) * K, 9, 0.05f);
  for (int n = 0; n < N; ++n) w[size_t(n) * K + 70] = 0.5f;  // every row's maximum in part 2
  std::vector<float> amax(static_cast<size_t>(N));
  row_amax(w.data(), N, K, amax.data());
  for (int n = 0; n < N; ++n) EXPECT_EQ(amax[size_t(n)], 0.5f);
  std::vector<float> part(size_t(N) * half);
  for (int n = 0; n < N; ++n)
    std::copy_n(w.begin() + n * K, half, part.begin() + n * half);  // columns [0, K/2)
  std::vector<float> s_whole(static_cast<size_t>(N)), s_part(s_whole.size()), s_own(s_whole.size());
  {
    std::vector<int8_t> q_whole(w.size()), q_part(part.size()), q_own(part.size());
    ASSERT_TRUE(quantize_int8_rows(w.data(), N, K, q_whole.data(), s_whole.data()));
    ASSERT_TRUE(
        quantize_int8_rows(part.data(), N, half, q_part.data(), s_part.data(), amax.data()));
    ASSERT_TRUE(quantize_int8_rows(part.data(), N, half, q_own.data(), s_own.data()));
    EXPECT_EQ(s_part, s_whole);
    EXPECT_NE(s_own, s_whole);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < half; ++k)
        ASSERT_EQ(q_part[size_t(n) * half + k], q_whole[size_t(n) * K + k]) << n << " " << k;
  }
  {
    std::vector<uint8_t> q_whole(w.size()), q_part(part.size()), q_own(part.size());
    ASSERT_TRUE(quantize_fp8_rows(w.data(), N, K, q_whole.data(), s_whole.data()));
    ASSERT_TRUE(quantize_fp8_rows(part.data(), N, half, q_part.data(), s_part.data(), amax.data()));
    ASSERT_TRUE(quantize_fp8_rows(part.data(), N, half, q_own.data(), s_own.data()));
    EXPECT_EQ(s_part, s_whole);
    EXPECT_NE(s_own, s_whole);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < half; ++k)
        ASSERT_EQ(q_part[size_t(n) * half + k], q_whole[size_t(n) * K + k]) << n << " " << k;
  }
  // A NaN or an infinity marks its row +inf (which a maximum over the parts keeps) and is
  // refused by both quantisers, also where only the given maximum carries it.
  w[size_t(4) * K + 80] = std::nanf("");
  w[size_t(6) * K + 2] = -std::numeric_limits<float>::infinity();
  row_amax(w.data(), N, K, amax.data());
  EXPECT_EQ(amax[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(amax[6], std::numeric_limits<float>::infinity());
  EXPECT_EQ(amax[5], 0.5f);
  std::vector<int8_t> q8(w.size());
  std::vector<uint8_t> qf(part.size());
  EXPECT_FALSE(quantize_int8_rows(part.data(), N, half, q8.data(), s_part.data(), amax.data()));
  EXPECT_FALSE(quantize_fp8_rows(part.data(), N, half, qf.data(), s_part.data(), amax.data()));
  EXPECT_FALSE(quantize_int8_rows(w.data(), N, K, q8.data(), s_part.data()));
}

// The decode weights' and KV pool's memory (gemm_lowp_pages.h): zero-filled, 2 MiB-aligned,
// movable; asking for huge pages over memory in use keeps its contents (whether the kernel
// grants them is its business: the bytes granted are whole aligned 2 MiB pieces of the range).
// The tile path (AMX CPUs: batches of kAmxMinRows inputs or more, K a multiple of 32) against
// the double reference with fp32 accumulation's bound, every weight type, batches within one
// block of 16 inputs and past it, row counts with blocks of 32 and 16 and a short last block.
TEST(GemmLowpAmx, MatchesTheReferenceForEveryWeightType) {
  Restore restore;
  if (!lowp_uses_amx()) GTEST_SKIP() << "this CPU (or its kernel) offers no AMX-BF16";
  for (int M : {kAmxMinRows, 7, 16, 17, 40})
    for (int K : {32, 96, 768})
      for (int N : {5, 16, 40, 77}) {
        const std::vector<float> x = randn(size_t(M) * K, 30), b = randn(size_t(N), 32);
        std::vector<float> w = randn(size_t(N) * K, 31, 0.1f), deq8(w.size()), deqf(w.size());
        std::vector<uint16_t> wb(w.size());
        std::vector<int8_t> q(w.size());
        std::vector<uint8_t> f(w.size());
        std::vector<float> s8(static_cast<size_t>(N)), sf(s8.size());
        ASSERT_TRUE(quantize_int8_rows(w.data(), N, K, q.data(), s8.data()));
        ASSERT_TRUE(quantize_fp8_rows(w.data(), N, K, f.data(), sf.data()));
        for (size_t i = 0; i < w.size(); ++i) {
          deq8[i] = s8[i / size_t(K)] * q[i];
          deqf[i] = sf[i / size_t(K)] * fp8_decode(Fp8Format::E4M3, f[i]);
          wb[i] = f32_to_bf16(w[i]);
          w[i] = bf16_to_f32(wb[i]);
        }
        std::vector<float> y(size_t(M) * N, -1.f);
        linear_bf16w(y.data(), x.data(), wb.data(), b.data(), M, K, N);
        check_against_reference(y, x, w, b, M, K, N);
        linear_int8w(y.data(), x.data(), q.data(), s8.data(), b.data(), M, K, N);
        check_against_reference(y, x, deq8, b, M, K, N);
        linear_fp8w(y.data(), x.data(), f.data(), sf.data(), nullptr, M, K, N);
        check_against_reference(y, x, deqf, {}, M, K, N);
      }
}

// No input is rounded to bf16: through one-hot weights (1 as bf16, int8 and E4M3) every output
// is its input bit for bit, inputs using all 24 bits of their significand (the three bf16 parts
// sum back to it exactly; two parts would keep 16 bits).
TEST(GemmLowpAmx, OneHotWeightsGiveEveryInputExactly) {
  Restore restore;
  if (!lowp_uses_amx()) GTEST_SKIP() << "this CPU (or its kernel) offers no AMX-BF16";
  const int K = 96;
  std::vector<uint16_t> wb(size_t(K) * K, 0);
  std::vector<int8_t> q(wb.size(), 0);
  std::vector<uint8_t> f(wb.size(), 0);
  for (int k = 0; k < K; ++k) {
    wb[size_t(k) * K + k] = 0x3F80;  // 1.0
    q[size_t(k) * K + k] = 1;
    f[size_t(k) * K + k] = 0x38;  // E4M3 1.0
  }
  const std::vector<float> ones(static_cast<size_t>(K), 1.f);
  for (int M : {kAmxMinRows, 16, 19}) {
    std::vector<float> x = randn(size_t(M) * K, 33);
    for (float& v : x) v *= 1.f + 0x1p-23f;  // (the last bit set in most)
    for (int t = 0; t < 3; ++t) {
      std::vector<float> y(x.size(), -1.f);
      if (t == 0) linear_bf16w(y.data(), x.data(), wb.data(), nullptr, M, K, K);
      if (t == 1) linear_int8w(y.data(), x.data(), q.data(), ones.data(), nullptr, M, K, K);
      if (t == 2) linear_fp8w(y.data(), x.data(), f.data(), ones.data(), nullptr, M, K, K);
      ASSERT_EQ(std::memcmp(y.data(), x.data(), x.size() * sizeof(float)), 0)
          << "type " << t << " M " << M;
    }
  }
}

// The tile path's rows depend only on their input and the weights: the same bits whatever the
// batch (within and across blocks of 16 inputs) and the thread count.
TEST(GemmLowpAmx, RowsDoNotDependOnTheBatchOrThreads) {
  Restore restore;
  if (!lowp_uses_amx()) GTEST_SKIP() << "this CPU (or its kernel) offers no AMX-BF16";
  const int M = 40, K = 96, N = 70000 / 96;  // past the threshold that splits rows over threads
  std::vector<float> x = randn(size_t(M) * K, 34), w = randn(size_t(N) * K, 35), s(size_t(N), 0.5f);
  std::vector<uint16_t> wb(w.size());
  std::vector<uint8_t> f(w.size());
  ASSERT_TRUE(quantize_fp8_rows(w.data(), N, K, f.data(), s.data()));
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  const auto run = [&](std::vector<float>& y, int m0, int rows, bool fp8) {
    if (fp8)
      linear_fp8w(y.data(), x.data() + size_t(m0) * K, f.data(), s.data(), nullptr, rows, K, N);
    else
      linear_bf16w(y.data(), x.data() + size_t(m0) * K, wb.data(), nullptr, rows, K, N);
  };
  for (bool fp8 : {false, true}) {
    std::vector<float> all(size_t(M) * N), part(size_t(16) * N);
    run(all, 0, M, fp8);
    for (int m0 : {0, 5, 12, 16, 29}) {  // blocks of kAmxMinRows inside, across and after 16
      run(part, m0, kAmxMinRows, fp8);
      EXPECT_TRUE(std::equal(part.begin(), part.begin() + long(kAmxMinRows) * N,
                             all.begin() + long(m0) * N))
          << "fp8 " << fp8 << " m0 " << m0;
    }
    run(part, 3, 16, fp8);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 3L * N)) << "fp8 " << fp8;
    const int t = num_threads();
    set_num_threads(1);
    std::vector<float> serial(all.size());
    run(serial, 0, M, fp8);
    set_num_threads(t);
    EXPECT_EQ(serial, all) << "fp8 " << fp8;
  }
}

TEST(GemmLowpPages, HugeBufferIsZeroedAlignedAndMovable) {
  const size_t huge = size_t(2) << 20;
  for (bool advise : {true, false}) {
    HugeBuffer a(3 * huge + 100, advise);
    ASSERT_NE(a.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % huge, 0u);
    EXPECT_EQ(a.size(), 3 * huge + 100);
    const uint8_t* p = a.as<uint8_t>();
    EXPECT_TRUE(std::all_of(p, p + a.size(), [](uint8_t b) { return b == 0; }));
    std::memset(a.data(), 7, a.size());
    HugeBuffer b(std::move(a));
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(a.size(), 0u);
    EXPECT_EQ(b.as<uint8_t>()[3 * huge + 99], 7);
    HugeBuffer c;
    c = std::move(b);
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_EQ(c.as<uint8_t>()[0], 7);
  }
  HugeBuffer empty(0);
  EXPECT_EQ(empty.data(), nullptr);
}

TEST(GemmLowpPages, UseHugePagesKeepsTheContents) {
  const size_t huge = size_t(2) << 20, n = (5 * huge + 12345) / sizeof(uint32_t);
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint32_t(i * 2654435761u);
  const size_t granted = use_huge_pages(v.data(), n * sizeof(uint32_t));
  EXPECT_EQ(granted % huge, 0u);
  EXPECT_LE(granted, n * sizeof(uint32_t));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], uint32_t(i * 2654435761u)) << i;
  EXPECT_EQ(use_huge_pages(nullptr, huge), 0u);
  EXPECT_EQ(use_huge_pages(v.data(), 100), 0u);  // no whole aligned 2 MiB
}
