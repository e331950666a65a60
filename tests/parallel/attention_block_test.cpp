// The full (non-causal) block attention kernel of ring attention against a float64 reference:
// forward output and log-sum-exp; the backward (given the final, merged out and lse) against
// central finite differences of the float64 reference, for one block and for keys split into
// two blocks whose forwards are merged (attention_merge) and whose backwards are summed.
#include "kernels/cpu/attention_block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention_merge.h"

using namespace loom;
using namespace loom::cpu;

namespace {

struct Problem {
  int nq, nk, Hq, Hkv, D, ldq, ldk;
  std::vector<float> q, k, v;  // q [nq, ldq]; k, v [nk, ldk]
};

Problem make(int nq, int nk, int Hq, int Hkv, int D, uint32_t seed) {
  Problem p{nq, nk, Hq, Hkv, D, Hq * D + 3, Hkv * D + 5, {}, {}, {}};
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  p.q.resize(size_t(nq) * p.ldq);
  p.k.resize(size_t(nk) * p.ldk);
  p.v.resize(size_t(nk) * p.ldk);
  for (auto* x : {&p.q, &p.k, &p.v})
    for (float& f : *x) f = n(g);
  return p;
}

// float64 full attention; returns <W, out> when W is given.
double reference(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, std::vector<double>* out, std::vector<double>* lse,
                 const std::vector<float>* W, double scale) {
  const int group = p.Hq / p.Hkv, D = p.D;
  double loss = 0;
  if (out) out->assign(size_t(p.nq) * p.Hq * D, 0.0);
  if (lse) lse->assign(size_t(p.nq) * p.Hq, 0.0);
  for (int i = 0; i < p.nq; ++i)
    for (int h = 0; h < p.Hq; ++h) {
      const int hk = h / group;
      std::vector<double> s(p.nk);
      double mx = -1e300;
      for (int j = 0; j < p.nk; ++j) {
        double d = 0;
        for (int e = 0; e < D; ++e) d += q[i * p.ldq + h * D + e] * k[j * p.ldk + hk * D + e];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = 0; j < p.nk; ++j) sum += std::exp(s[j] - mx);
      for (int e = 0; e < D; ++e) {
        double o = 0;
        for (int j = 0; j < p.nk; ++j) o += std::exp(s[j] - mx) / sum * v[j * p.ldk + hk * D + e];
        if (out) (*out)[(size_t(i) * p.Hq + h) * D + e] = o;
        if (W) loss += o * (*W)[(size_t(i) * p.Hq + h) * D + e];
      }
      if (lse) (*lse)[size_t(i) * p.Hq + h] = mx + std::log(sum);
    }
  return loss;
}

std::vector<double> to_double(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

// d<W, out>/dx of the float64 reference by central differences, for a few entries of x.
void check_grad(const Problem& p, const std::vector<float>& W, int which,
                const std::vector<float>& g, float scale, const char* name) {
  auto q = to_double(p.q), k = to_double(p.k), v = to_double(p.v);
  std::vector<double>& x = which == 0 ? q : which == 1 ? k : v;
  const int rows = which == 0 ? p.nq : p.nk, ld = which == 0 ? p.ldq : p.ldk;
  const int width = which == 0 ? p.Hq * p.D : p.Hkv * p.D;
  std::mt19937 rng(7 + which);
  double gmax = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < width; ++c) gmax = std::max(gmax, std::abs(double(g[size_t(r) * ld + c])));
  ASSERT_GT(gmax, 0) << name;
  for (int t = 0; t < 40; ++t) {
    const size_t idx = size_t(rng() % rows) * ld + rng() % width;
    const double h = 1e-5, x0 = x[idx];
    x[idx] = x0 + h;
    const double up = reference(p, q, k, v, nullptr, nullptr, &W, scale);
    x[idx] = x0 - h;
    const double dn = reference(p, q, k, v, nullptr, nullptr, &W, scale);
    x[idx] = x0;
    const double fd = (up - dn) / (2 * h);
    EXPECT_NEAR(g[idx], fd, 2e-5 * gmax + 1e-4 * std::abs(fd)) << name << " element " << idx;
  }
}

void run_case(int nq, int nk, int Hq, int Hkv, int D, int split) {
  Problem p = make(nq, nk, Hq, Hkv, D, 11u * nq + nk);
  const float scale = 1.f / std::sqrt(float(D));
  std::vector<double> rout, rlse;
  reference(p, to_double(p.q), to_double(p.k), to_double(p.v), &rout, &rlse, nullptr, scale);

  // Forward: the keys in one block (split = nk) or two merged blocks [0, split), [split, nk).
  const size_t no = size_t(nq) * Hq * D, nl = size_t(nq) * Hq;
  std::vector<float> out(no), lse(nl), ob(no), lb(nl);
  attention_block_forward(out.data(), lse.data(), p.q.data(), p.ldq, p.k.data(), p.v.data(), p.ldk,
                          nq, split, Hq, Hkv, D, scale);
  if (split < nk) {
    const float* kb = p.k.data() + size_t(split) * p.ldk;
    const float* vb = p.v.data() + size_t(split) * p.ldk;
    attention_block_forward(ob.data(), lb.data(), p.q.data(), p.ldq, kb, vb, p.ldk, nq, nk - split,
                            Hq, Hkv, D, scale);
    attention_merge(out.data(), lse.data(), out.data(), lse.data(), ob.data(), lb.data(), nq, Hq,
                    D);
  }
  for (size_t i = 0; i < no; ++i) ASSERT_NEAR(out[i], rout[i], 2e-5 * (1 + std::abs(rout[i]))) << i;
  for (size_t i = 0; i < nl; ++i) ASSERT_NEAR(lse[i], rlse[i], 2e-5 * (1 + std::abs(rlse[i]))) << i;

  // Backward of L = <W, out>: dout = W; each block's backward uses the merged out and lse.
  std::vector<float> W(no);
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.f, 1.f);
  for (float& w : W) w = n(g);
  std::vector<float> dq(p.q.size(), 0.f), dk(p.k.size(), 0.f), dv(p.v.size(), 0.f);
  attention_block_backward(dq.data(), dk.data(), dv.data(), W.data(), out.data(), lse.data(),
                           p.q.data(), p.ldq, p.k.data(), p.v.data(), p.ldk, nq, split, Hq, Hkv, D,
                           scale);
  if (split < nk) {
    const size_t off = size_t(split) * p.ldk;
    attention_block_backward(dq.data(), dk.data() + off, dv.data() + off, W.data(), out.data(),
                             lse.data(), p.q.data(), p.ldq, p.k.data() + off, p.v.data() + off,
                             p.ldk, nq, nk - split, Hq, Hkv, D, scale);
  }
  check_grad(p, W, 0, dq, scale, "dq");
  check_grad(p, W, 1, dk, scale, "dk");
  check_grad(p, W, 2, dv, scale, "dv");
  // The padding columns between heads (row stride > heads) are never written.
  for (int r = 0; r < nq; ++r)
    for (int c = Hq * D; c < p.ldq; ++c) EXPECT_EQ(dq[size_t(r) * p.ldq + c], 0.f);
}

}  // namespace

TEST(AttentionBlock, OneBlockMatchesFloat64AndFiniteDifferences) {
  run_case(70, 90, 4, 2, 12, 90);  // tiles cross 64-row boundaries; GQA group 2
}
TEST(AttentionBlock, TwoMergedBlocksMatchTheWholeAttention) {
  run_case(37, 130, 2, 2, 8, 67);
  run_case(5, 3, 3, 1, 16, 1);
}
TEST(AttentionBlock, EmptyKeysGiveZeroOutAndMinusInfLse) {
  Problem p = make(4, 0, 2, 1, 8, 1);
  std::vector<float> out(4 * 2 * 8, 5.f), lse(8, 5.f);
  attention_block_forward(out.data(), lse.data(), p.q.data(), p.ldq, nullptr, nullptr, p.ldk, 4, 0,
                          2, 1, 8, 0.5f);
  for (float o : out) EXPECT_EQ(o, 0.f);
  for (float l : lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
  EXPECT_THROW(attention_block_forward(out.data(), lse.data(), p.q.data(), p.ldq, nullptr, nullptr,
                                       p.ldk, 4, 0, 3, 2, 8, 0.5f),
               Error);  // Hq not a multiple of Hkv
}
