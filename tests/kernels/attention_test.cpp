// Causal attention (cpu::attention_forward / attention_backward) against a float64 reference
// that builds the full score matrix with the causal + document mask; the reference backward is
// itself checked against central finite differences of the reference forward.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "same_bits.h"

namespace {

// One attention problem in the fused-QKV layout the model uses: each token row holds
// [q heads | k heads | v heads] (plus `pad` unused floats), so q, k, v share the stride ld.
struct Problem {
  int Hq, Hkv, D, ld, N;
  std::vector<int32_t> cu;
  float scale;
  std::vector<float> qkv;   // N x ld
  std::vector<float> dout;  // N x Hq*D

  Problem(std::vector<int> lens, int hq, int hkv, int d, uint32_t seed, int pad = 0,
          float spread = 1.5f)
      : Hq(hq), Hkv(hkv), D(d), ld((hq + 2 * hkv) * d + pad), cu{0} {
    for (int len : lens) cu.push_back(cu.back() + len);
    N = cu.back();
    scale = 1.0f / std::sqrt((float)D);
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-spread, spread);
    qkv.resize((size_t)N * ld);
    for (float& x : qkv) x = u(gen);
    dout.resize((size_t)N * Hq * D);
    for (float& x : dout) x = u(gen);
  }
  int nseq() const { return (int)cu.size() - 1; }
  size_t q_off(int row, int h) const { return (size_t)row * ld + (size_t)h * D; }
  size_t k_off(int row, int h) const { return (size_t)row * ld + (size_t)(Hq + h) * D; }
  size_t v_off(int row, int h) const { return (size_t)row * ld + (size_t)(Hq + Hkv + h) * D; }
};

struct Result {
  std::vector<float> out, lse, dqkv;
};

Result run_kernel(const Problem& p, bool backward, float dqkv_fill = 0.0f) {
  Result r;
  r.out.assign((size_t)p.N * p.Hq * p.D, std::numeric_limits<float>::quiet_NaN());
  r.lse.assign((size_t)p.N * p.Hq, std::numeric_limits<float>::quiet_NaN());
  const float* q = p.qkv.data();
  const float* k = q + p.Hq * p.D;
  const float* v = k + p.Hkv * p.D;
  loom::cpu::attention_forward(r.out.data(), r.lse.data(), q, k, v, p.ld, p.cu.data(), p.nseq(),
                               p.Hq, p.Hkv, p.D, p.scale);
  if (backward) {
    r.dqkv.assign((size_t)p.N * p.ld, dqkv_fill);
    float* dq = r.dqkv.data();
    float* dk = dq + p.Hq * p.D;
    float* dv = dk + p.Hkv * p.D;
    loom::cpu::attention_backward(dq, dk, dv, p.dout.data(), q, k, v, r.out.data(), r.lse.data(),
                                  p.ld, p.cu.data(), p.nseq(), p.Hq, p.Hkv, p.D, p.scale);
  }
  return r;
}

// ---- float64 reference --------------------------------------------------------------------

// Forward of one sequence: out rows and lse of sequence s from a double copy of qkv.
void ref_forward_seq(const Problem& p, const std::vector<double>& qkv, int s,
                     std::vector<double>& out, std::vector<double>& lse) {
  const int b = p.cu[s], e = p.cu[s + 1], G = p.Hq / p.Hkv;
  std::vector<double> sc;
  for (int h = 0; h < p.Hq; ++h) {
    for (int i = b; i < e; ++i) {
      sc.assign(i - b + 1, 0.0);
      double mx = -1e300;
      for (int j = b; j <= i; ++j) {  // causal, and only within this sequence
        double dot = 0;
        for (int d = 0; d < p.D; ++d) dot += qkv[p.q_off(i, h) + d] * qkv[p.k_off(j, h / G) + d];
        sc[j - b] = dot * p.scale;
        mx = std::max(mx, sc[j - b]);
      }
      double sum = 0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (int d = 0; d < p.D; ++d) {
        double o = 0;
        for (int j = b; j <= i; ++j) o += sc[j - b] * qkv[p.v_off(j, h / G) + d];
        out[(size_t)i * p.Hq * p.D + h * p.D + d] = o / sum;
      }
      lse[(size_t)i * p.Hq + h] = mx + std::log(sum);
    }
  }
}

void ref_forward(const Problem& p, const std::vector<double>& qkv, std::vector<double>& out,
                 std::vector<double>& lse) {
  out.assign((size_t)p.N * p.Hq * p.D, 0.0);
  lse.assign((size_t)p.N * p.Hq, 0.0);
  for (int s = 0; s < p.nseq(); ++s) ref_forward_seq(p, qkv, s, out, lse);
}

// Analytic backward in float64: P from the full score row, dS = P * (dP - rowsum(P * dP)).
std::vector<double> ref_backward(const Problem& p, const std::vector<double>& qkv,
                                 const std::vector<double>& dout) {
  std::vector<double> g((size_t)p.N * p.ld, 0.0);
  const int G = p.Hq / p.Hkv;
  std::vector<double> P, dP;
  for (int s = 0; s < p.nseq(); ++s) {
    const int b = p.cu[s], e = p.cu[s + 1];
    for (int h = 0; h < p.Hq; ++h) {
      const int hk = h / G;
      for (int i = b; i < e; ++i) {
        const int n = i - b + 1;
        P.assign(n, 0.0);
        dP.assign(n, 0.0);
        double mx = -1e300, sum = 0, rowdot = 0;
        for (int j = b; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < p.D; ++d) dot += qkv[p.q_off(i, h) + d] * qkv[p.k_off(j, hk) + d];
          P[j - b] = dot * p.scale;
          mx = std::max(mx, P[j - b]);
        }
        for (double& x : P) sum += (x = std::exp(x - mx));
        const double* go = &dout[(size_t)i * p.Hq * p.D + h * p.D];
        for (int j = b; j <= i; ++j) {
          P[j - b] /= sum;
          double dot = 0;
          for (int d = 0; d < p.D; ++d) dot += go[d] * qkv[p.v_off(j, hk) + d];
          dP[j - b] = dot;
          rowdot += P[j - b] * dot;
        }
        for (int j = b; j <= i; ++j) {
          const double pj = P[j - b], ds = pj * (dP[j - b] - rowdot) * p.scale;
          for (int d = 0; d < p.D; ++d) {
            g[p.v_off(j, hk) + d] += pj * go[d];
            g[p.q_off(i, h) + d] += ds * qkv[p.k_off(j, hk) + d];
            g[p.k_off(j, hk) + d] += ds * qkv[p.q_off(i, h) + d];
          }
        }
      }
    }
  }
  return g;
}

std::vector<double> to_double(const std::vector<float>& x) {
  return std::vector<double>(x.begin(), x.end());
}

// Largest |got - want| / (atol + rtol |want|) over n values (<= 1 passes); names the worst index.
void expect_close(const float* got, const double* want, size_t n, double atol, double rtol,
                  const std::string& what) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(got[i] - want[i]) / (atol + rtol * std::fabs(want[i]));
    if (!(err <= worst)) {  // catches NaN too
      worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
      at = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": worst at index " << at << " got " << got[at] << " want "
                        << want[at];
}

// The columns of the fused row that hold q, k and v heads (pad columns excluded).
std::vector<size_t> head_entries(const Problem& p) {
  std::vector<size_t> idx;
  for (int r = 0; r < p.N; ++r)
    for (int c = 0; c < (p.Hq + 2 * p.Hkv) * p.D; ++c) idx.push_back((size_t)r * p.ld + c);
  return idx;
}

// atol is for values of order 1; float rounding of the scores grows with their size.
void check_forward(const Problem& p, const std::string& what, double atol = 2e-6) {
  const Result r = run_kernel(p, false);
  std::vector<double> out, lse;
  ref_forward(p, to_double(p.qkv), out, lse);
  expect_close(r.out.data(), out.data(), out.size(), atol, 2e-5, what + " out");
  expect_close(r.lse.data(), lse.data(), lse.size(), 2e-6, 2e-6, what + " lse");
}

void check_backward(const Problem& p, const std::string& what) {
  const Result r = run_kernel(p, true, std::numeric_limits<float>::quiet_NaN());
  const std::vector<double> g = ref_backward(p, to_double(p.qkv), to_double(p.dout));
  std::vector<float> got;
  std::vector<double> want;
  for (size_t i : head_entries(p)) {
    got.push_back(r.dqkv[i]);
    want.push_back(g[i]);
  }
  expect_close(got.data(), want.data(), got.size(), 2e-5, 1e-4, what + " dqkv");
}

// ---- forward -------------------------------------------------------------------------------

TEST(Attention, ForwardMatchesReferenceMHA) {
  check_forward(Problem({1, 0, 69, 130, 64}, 2, 2, 16, 1), "MHA D=16");
  check_forward(Problem({200}, 3, 3, 64, 2), "MHA D=64");
  check_forward(Problem({300, 260}, 2, 2, 64, 21), "MHA long");
}

TEST(Attention, ForwardMatchesReferenceGQA) {
  check_forward(Problem({5, 0, 0, 1, 97}, 6, 2, 24, 3), "GQA 6/2 D=24");
  check_forward(Problem({150, 17}, 4, 1, 128, 4), "GQA 4/1 D=128");
  check_forward(Problem({65, 63}, 2, 1, 8, 5), "GQA 2/1 D=8");
  check_forward(Problem({3, 77}, 3, 1, 20, 24), "GQA 3/1 D=20");
  check_forward(Problem({9, 66}, 2, 2, 3, 25), "MHA D=3");
  check_forward(Problem({70}, 2, 2, 40, 6, /*pad=*/8), "padded row stride D=40");
}

TEST(Attention, PeakedScoresRescaleTheRunningMax) {
  // Large logits make the running max move a lot between key tiles.
  Problem p({130, 3}, 2, 1, 32, 7, 0, /*spread=*/4.0f);
  check_forward(p, "spread 4", 1e-5);
  // Keys of later tiles scaled up: each new key tile raises the row max far beyond the lazy
  // rescaling threshold, so the accumulator must be rescaled (and lse must follow).
  Problem grow({200}, 2, 1, 16, 32);
  for (int row = 0; row < grow.N; ++row)
    for (int d = 0; d < grow.D; ++d) grow.qkv[grow.k_off(row, 0) + d] *= 1.0f + (row / 64) * 3.0f;
  check_forward(grow, "growing keys", 2e-5);
  check_backward(grow, "growing keys");
}

TEST(Attention, LengthOneSequenceCopiesV) {
  Problem p({1, 1, 0, 1}, 2, 1, 24, 8);
  const Result r = run_kernel(p, false);
  for (int row = 0; row < p.N; ++row)
    for (int h = 0; h < p.Hq; ++h) {
      for (int d = 0; d < p.D; ++d)
        EXPECT_EQ(r.out[(size_t)row * p.Hq * p.D + h * p.D + d], p.qkv[p.v_off(row, h / 2) + d]);
      double dot = 0;
      for (int d = 0; d < p.D; ++d)
        dot += (double)p.qkv[p.q_off(row, h) + d] * p.qkv[p.k_off(row, h / 2) + d];
      EXPECT_NEAR(r.lse[(size_t)row * p.Hq + h], dot * p.scale, 1e-5);
    }
}

TEST(Attention, EmptyBatchIsANoOp) {
  Problem p({0, 0}, 2, 2, 16, 9);
  const Result r = run_kernel(p, true);  // N = 0: nothing to read or write
  EXPECT_TRUE(r.out.empty());
  const int32_t cu0[1] = {0};
  loom::cpu::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, 48, cu0, 0, 2, 2, 16,
                               0.25f);
}

// ---- backward ------------------------------------------------------------------------------

TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  // L = sum(out * W) with W = dout; dL/dx by central differences of the float64 forward,
  // recomputing only the sequence that the perturbed row belongs to.
  Problem p({3, 0, 1, 9}, 4, 2, 8, 10);
  const std::vector<double> W = to_double(p.dout);
  std::vector<double> x = to_double(p.qkv);
  const std::vector<double> g = ref_backward(p, x, W);
  std::vector<double> out((size_t)p.N * p.Hq * p.D), lse((size_t)p.N * p.Hq);
  auto loss_of_seq = [&](int s) {
    ref_forward_seq(p, x, s, out, lse);
    double L = 0;
    for (size_t i = (size_t)p.cu[s] * p.Hq * p.D; i < (size_t)p.cu[s + 1] * p.Hq * p.D; ++i)
      L += out[i] * W[i];
    return L;
  };
  const double eps = 1e-5;
  double worst = 0;
  for (int s = 0; s < p.nseq(); ++s)
    for (int row = p.cu[s]; row < p.cu[s + 1]; ++row)
      for (int c = 0; c < p.ld; ++c) {
        const size_t i = (size_t)row * p.ld + c;
        const double x0 = x[i];
        x[i] = x0 + eps;
        const double lp = loss_of_seq(s);
        x[i] = x0 - eps;
        const double lm = loss_of_seq(s);
        x[i] = x0;
        worst = std::max(worst, std::fabs((lp - lm) / (2 * eps) - g[i]));
      }
  EXPECT_LT(worst, 1e-7);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  // The kernel's gradient against central differences of the float64 forward, directly.
  Problem p({2, 1, 0, 7}, 2, 1, 24, 11);
  const Result r = run_kernel(p, true);
  std::vector<double> x = to_double(p.qkv), out, lse;
  const std::vector<double> W = to_double(p.dout);
  auto loss = [&] {
    ref_forward(p, x, out, lse);
    double L = 0;
    for (size_t i = 0; i < out.size(); ++i) L += out[i] * W[i];
    return L;
  };
  std::vector<float> got;
  std::vector<double> fd;
  for (size_t i : head_entries(p)) {
    const double x0 = x[i], eps = 1e-5;
    x[i] = x0 + eps;
    const double lp = loss();
    x[i] = x0 - eps;
    const double lm = loss();
    x[i] = x0;
    got.push_back(r.dqkv[i]);
    fd.push_back((lp - lm) / (2 * eps));
  }
  expect_close(got.data(), fd.data(), got.size(), 2e-5, 1e-4, "kernel vs finite differences");
}

TEST(Attention, BackwardMatchesReferenceMHA) {
  check_backward(Problem({1, 0, 69, 130, 64}, 2, 2, 16, 12), "MHA D=16");
  check_backward(Problem({200}, 2, 2, 64, 13), "MHA D=64");
  check_backward(Problem({300, 260}, 2, 2, 64, 22), "MHA long");
}

TEST(Attention, BackwardMatchesReferenceGQA) {
  check_backward(Problem({5, 0, 1, 97}, 6, 2, 24, 14), "GQA 6/2 D=24");
  check_backward(Problem({140}, 4, 1, 128, 15), "GQA 4/1 D=128");
  check_backward(Problem({3, 77}, 3, 1, 20, 26), "GQA 3/1 D=20");
  check_backward(Problem({130, 3}, 2, 1, 32, 16, 0, /*spread=*/3.0f), "GQA peaked");
}

TEST(Attention, ThousandsOfShortSequences) {
  std::vector<int> lens;
  for (int i = 0; i < 3000; ++i) lens.push_back(i * 7 % 6);  // 0..5 tokens, empty ones included
  lens.push_back(80);
  check_forward(Problem(lens, 2, 1, 8, 27), "3001 sequences");
  check_backward(Problem(lens, 2, 1, 8, 28), "3001 sequences");
}

TEST(Attention, HeadDimsAcrossVectorChunks) {
  // D = 80 and 96 split into a 4-vector chunk plus a remainder in the P V / dS K kernels.
  check_forward(Problem({90}, 2, 1, 80, 29), "D=80");
  check_backward(Problem({90}, 2, 1, 96, 30), "D=96");
}

TEST(Attention, BackwardWritesHeadsAndLeavesRowPaddingAlone) {
  Problem p({70, 1}, 2, 1, 40, 17, /*pad=*/8);
  const float sentinel = 12345.0f;
  const Result r = run_kernel(p, true, sentinel);
  const int used = (p.Hq + 2 * p.Hkv) * p.D;
  for (int row = 0; row < p.N; ++row)
    for (int c = 0; c < p.ld; ++c) {
      const float x = r.dqkv[(size_t)row * p.ld + c];
      if (c < used)
        ASSERT_TRUE(std::isfinite(x) && x != sentinel) << "row " << row << " col " << c;
      else
        ASSERT_EQ(x, sentinel) << "padding overwritten at row " << row << " col " << c;
    }
}

// ---- packing and determinism ---------------------------------------------------------------

TEST(Attention, PackedDocumentsDoNotAttendAcrossBoundaries) {
  const std::vector<int> lens = {37, 1, 0, 100, 64};
  Problem packed(lens, 4, 2, 32, 18);
  const Result rp = run_kernel(packed, true);
  for (size_t s = 0; s < lens.size(); ++s) {
    Problem doc({lens[s]}, 4, 2, 32, 0);
    const int b = packed.cu[s];
    std::copy(packed.qkv.begin() + (size_t)b * packed.ld,
              packed.qkv.begin() + (size_t)(b + lens[s]) * packed.ld, doc.qkv.begin());
    const size_t wo = (size_t)packed.Hq * packed.D;
    std::copy(packed.dout.begin() + b * wo, packed.dout.begin() + (b + lens[s]) * wo,
              doc.dout.begin());
    const Result rd = run_kernel(doc, true);
    // Tiles start at each document's first token, so the arithmetic is the same: exact equality.
    for (size_t i = 0; i < rd.out.size(); ++i) ASSERT_EQ(rd.out[i], rp.out[b * wo + i]) << s;
    for (size_t i = 0; i < rd.lse.size(); ++i) ASSERT_EQ(rd.lse[i], rp.lse[b * packed.Hq + i]);
    for (size_t i = 0; i < rd.dqkv.size(); ++i)
      ASSERT_EQ(rd.dqkv[i], rp.dqkv[(size_t)b * packed.ld + i]) << "doc " << s << " at " << i;
  }
  // And changing one document leaves the others' outputs untouched.
  Problem changed = packed;
  for (int r = packed.cu[0]; r < packed.cu[1]; ++r)
    for (int c = 0; c < packed.ld; ++c) changed.qkv[(size_t)r * packed.ld + c] *= -0.5f;
  const Result rc = run_kernel(changed, false);
  const size_t from = (size_t)packed.cu[1] * packed.Hq * packed.D;
  for (size_t i = from; i < rc.out.size(); ++i) ASSERT_EQ(rc.out[i], rp.out[i]);
  EXPECT_NE(rc.out[0], rp.out[0]);
}

TEST(Attention, BitIdenticalAcrossThreadCounts) {
  // The backward picks its schedule from the thread count (one item per (sequence, kv head)
  // when there are enough of them, finer items otherwise). The first problem has 2 such items:
  // 1 thread takes the fused schedule, 2 and 5 threads the split one, so this also checks that
  // both schedules give the same bits. The second has many items (fused up to 5 threads).
  const Problem problems[] = {Problem({200}, 4, 2, 32, 19),
                              Problem({200, 5, 130, 64, 1, 0, 70}, 6, 3, 24, 23)};
  const int saved = omp_get_max_threads();
  for (const Problem& p : problems) {
    omp_set_num_threads(1);
    const Result one = run_kernel(p, true);
    for (int threads : {2, 5}) {
      omp_set_num_threads(threads);
      const Result many = run_kernel(p, true);
      EXPECT_TRUE(loom::test::same_bits(one.out, many.out)) << threads << " threads";
      EXPECT_TRUE(loom::test::same_bits(one.lse, many.lse)) << threads << " threads";
      EXPECT_TRUE(loom::test::same_bits(one.dqkv, many.dqkv)) << threads << " threads";
    }
    const Result again = run_kernel(p, true);
    EXPECT_TRUE(loom::test::same_bits(one.dqkv, again.dqkv));
  }
  omp_set_num_threads(saved);
}

TEST(Attention, NanInAQueryReachesItsOutputRow) {
  // A NaN must surface (so overflow checks see it), not be swallowed by the softmax.
  Problem p({70, 5}, 2, 1, 16, 31);
  const int row = 66, h = 1;
  p.qkv[p.q_off(row, h) + 3] = std::numeric_limits<float>::quiet_NaN();
  const Result r = run_kernel(p, false);
  for (int i = 0; i < p.N; ++i)
    for (int hh = 0; hh < p.Hq; ++hh) {
      const float x = r.out[(size_t)i * p.Hq * p.D + hh * p.D];
      if (i == row && hh == h)
        EXPECT_TRUE(std::isnan(x));
      else
        EXPECT_TRUE(std::isfinite(x)) << "row " << i << " head " << hh;
    }
}

// ---- bad input -----------------------------------------------------------------------------

TEST(Attention, RejectsBadShapes) {
  // (Each call must throw loom::Error before touching any buffer.)
  Problem p({4}, 3, 2, 8, 20);
  std::vector<float> out(100), lse(100);
  const float* q = p.qkv.data();
  EXPECT_THROW(loom::cpu::attention_forward(out.data(), lse.data(), q, q, q, p.ld, p.cu.data(), 1,
                                            3, 2, 8, 0.3f),
               loom::Error);  // Hq not a multiple of Hkv
  const int32_t bad_cu[3] = {0, 3, 2};
  EXPECT_THROW(
      loom::cpu::attention_forward(out.data(), lse.data(), q, q, q, p.ld, bad_cu, 2, 2, 2, 8, 0.3f),
      loom::Error);  // decreasing offsets
  EXPECT_THROW(loom::cpu::attention_forward(out.data(), lse.data(), q, q, q, 8, p.cu.data(), 1, 2,
                                            2, 8, 0.3f),
               loom::Error);  // row stride smaller than the heads
}

}  // namespace
