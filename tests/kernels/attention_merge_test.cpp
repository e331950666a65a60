// Ring-attention building blocks (kernels/cpu/attention_merge.h): merging partial attention
// results by their log-sum-exps reproduces full causal attention exactly (a simulated ring over
// the load-balanced CP layout, packed documents, grouped-query heads), the merge's backward
// against finite differences, and the chunk map's round trip, balance and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "grad_check.h"
#include "kernels/cpu/attention_merge.h"
#include "kernels/cpu/cpu_ops.h"

namespace {

using loom::test::all_close;
using loom::test::random_floats;
using loom::test::to_f64;
using loom::test::Vec;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Fused rows [q heads | k heads | v heads], as the model lays them out.
struct Qkv {
  int Hq, Hkv, D;
  int ld() const { return (Hq + 2 * Hkv) * D; }
};

// Attention of query rows against key rows under the causal document mask, from the
// definition in float64: keys of the same document at positions <= the query's. Writes out
// [nq, Hq*D] and lse [nq, Hq] (-inf and zeros for a row that sees no key).
void ref_partial(std::vector<float>& out, std::vector<float>& lse, const Qkv& s,
                 const std::vector<float>& qrows, const std::vector<int>& qdoc,
                 const std::vector<int>& qpos, const std::vector<float>& krows,
                 const std::vector<int>& kdoc, const std::vector<int>& kpos) {
  const int nq = static_cast<int>(qdoc.size()), nk = static_cast<int>(kdoc.size());
  const int ld = s.ld(), D = s.D, group = s.Hq / s.Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  out.assign(static_cast<size_t>(nq) * s.Hq * D, 0.0f);
  lse.assign(static_cast<size_t>(nq) * s.Hq, kNegInf);
  for (int i = 0; i < nq; ++i)
    for (int h = 0; h < s.Hq; ++h) {
      const int hk = h / group;
      std::vector<double> sc;
      std::vector<int> keys;
      for (int j = 0; j < nk; ++j) {
        if (kdoc[j] != qdoc[i] || kpos[j] > qpos[i]) continue;
        double d = 0.0;
        for (int c = 0; c < D; ++c)
          d += static_cast<double>(qrows[(size_t)i * ld + h * D + c]) *
               krows[(size_t)j * ld + (s.Hq + hk) * D + c];
        sc.push_back(d * scale);
        keys.push_back(j);
      }
      if (keys.empty()) continue;
      const double m = *std::max_element(sc.begin(), sc.end());
      double sum = 0.0;
      for (double x : sc) sum += std::exp(x - m);
      for (int c = 0; c < D; ++c) {
        double o = 0.0;
        for (size_t t = 0; t < keys.size(); ++t)
          o +=
              std::exp(sc[t] - m) / sum * krows[(size_t)keys[t] * ld + (s.Hq + s.Hkv + hk) * D + c];
        out[(size_t)i * s.Hq * D + h * D + c] = static_cast<float>(o);
      }
      lse[(size_t)i * s.Hq + h] = static_cast<float>(m + std::log(sum));
    }
}

std::vector<int> doc_ids(const loom::cpu::CpShard& sh) {
  std::vector<int> d(sh.rows());
  for (const auto& p : sh.pieces)
    for (int i = 0; i < p.len; ++i) d[p.local_begin + i] = p.doc;
  return d;
}

// A simulated ring: rank r starts from its own block (the causal kernel on its local rows: the
// diagonal), then merges the blocks of ranks r-1, r-2, ... (the order KV arrives in a ring).
TEST(AttentionMerge, RingOverLoadBalancedChunksEqualsFullAttention) {
  const Qkv s{4, 2, 16};
  const std::vector<int32_t> cu = {0, 64, 192, 200};  // three packed documents
  const int N = cu.back(), nseq = 3;
  const std::vector<float> qkv = random_floats((size_t)N * s.ld(), 7, -1.5f, 1.5f);
  std::vector<float> full_out((size_t)N * s.Hq * s.D), full_lse((size_t)N * s.Hq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  loom::cpu::attention_forward(full_out.data(), full_lse.data(), qkv.data(),
                               qkv.data() + s.Hq * s.D, qkv.data() + (s.Hq + s.Hkv) * s.D, s.ld(),
                               cu.data(), nseq, s.Hq, s.Hkv, s.D, scale);
  for (int cp : {1, 2, 4}) {
    SCOPED_TRACE(loom::cat("cp=", cp));
    std::vector<loom::cpu::CpShard> shards;
    std::vector<std::vector<float>> local_qkv;
    for (int r = 0; r < cp; ++r) {
      shards.push_back(loom::cpu::cp_shard(cu.data(), nseq, cp, r));
      local_qkv.emplace_back((size_t)shards[r].rows() * s.ld());
      loom::cpu::cp_gather_rows(local_qkv[r].data(), qkv.data(), shards[r], s.ld());
    }
    std::vector<float> ring_out((size_t)N * s.Hq * s.D), ring_lse((size_t)N * s.Hq);
    for (int r = 0; r < cp; ++r) {
      const auto& sh = shards[r];
      const int n = sh.rows();
      std::vector<float> out((size_t)n * s.Hq * s.D), lse((size_t)n * s.Hq);
      const float* q = local_qkv[r].data();
      loom::cpu::attention_forward(out.data(), lse.data(), q, q + s.Hq * s.D,
                                   q + (s.Hq + s.Hkv) * s.D, s.ld(), sh.local_cu_seqlens.data(),
                                   nseq, s.Hq, s.Hkv, s.D, scale);
      for (int step = 1; step < cp; ++step) {
        const int src = (r - step + cp) % cp;
        std::vector<float> po, pl;
        ref_partial(po, pl, s, local_qkv[r], doc_ids(sh), sh.positions, local_qkv[src],
                    doc_ids(shards[src]), shards[src].positions);
        loom::cpu::attention_merge(out.data(), lse.data(), out.data(), lse.data(), po.data(),
                                   pl.data(), n, s.Hq, s.D);
      }
      loom::cpu::cp_scatter_rows(ring_out.data(), out.data(), sh, s.Hq * s.D);
      loom::cpu::cp_scatter_rows(ring_lse.data(), lse.data(), sh, s.Hq);
    }
    EXPECT_TRUE(all_close(ring_out, to_f64(full_out), 2e-6, 1e-5));
    EXPECT_TRUE(all_close(ring_lse, to_f64(full_lse), 2e-6, 1e-5));
  }
}

TEST(AttentionMerge, OrderDoesNotMatterAndEmptySidesPassThrough) {
  const int N = 5, H = 3, D = 8;
  std::vector<std::vector<float>> outs, lses;
  for (int i = 0; i < 3; ++i) {
    outs.push_back(random_floats(N * H * D, 100 + i));
    lses.push_back(random_floats(N * H, 200 + i, -4.0f, 4.0f));
  }
  lses[1][4] = kNegInf;  // one row of block 1 saw no keys
  auto merge = [&](int a, int b, int c) {
    std::vector<float> o = outs[a], l = lses[a];
    loom::cpu::attention_merge(o.data(), l.data(), o.data(), l.data(), outs[b].data(),
                               lses[b].data(), N, H, D);
    loom::cpu::attention_merge(o.data(), l.data(), o.data(), l.data(), outs[c].data(),
                               lses[c].data(), N, H, D);
    return std::make_pair(o, l);
  };
  const auto abc = merge(0, 1, 2), cba = merge(2, 1, 0);
  // Float64 reference of the three-way softmax-weighted combination.
  Vec ro(N * H * D), rl(N * H);
  for (int i = 0; i < N * H; ++i) {
    double m = -INFINITY, sum = 0.0;
    for (int b = 0; b < 3; ++b) m = std::max(m, (double)lses[b][i]);
    for (int b = 0; b < 3; ++b) sum += std::exp(lses[b][i] - m);
    rl[i] = m + std::log(sum);
    for (int d = 0; d < D; ++d)
      for (int b = 0; b < 3; ++b)
        ro[i * D + d] += std::exp(lses[b][i] - rl[i]) * outs[b][i * D + d];
  }
  EXPECT_TRUE(all_close(abc.first, ro, 1e-6, 1e-5));
  EXPECT_TRUE(all_close(cba.first, ro, 1e-6, 1e-5));
  EXPECT_TRUE(all_close(abc.second, rl, 1e-6, 1e-6));
  // Empty with non-empty: the non-empty side exactly; empty with empty: zeros and -inf.
  std::vector<float> empty_out(N * H * D, 0.0f), empty_lse(N * H, kNegInf), o(N * H * D), l(N * H);
  loom::cpu::attention_merge(o.data(), l.data(), empty_out.data(), empty_lse.data(), outs[0].data(),
                             lses[0].data(), N, H, D);
  EXPECT_EQ(0, std::memcmp(o.data(), outs[0].data(), o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(l.data(), lses[0].data(), l.size() * sizeof(float)));
  loom::cpu::attention_merge(o.data(), l.data(), empty_out.data(), empty_lse.data(),
                             empty_out.data(), empty_lse.data(), N, H, D);
  for (float x : o) ASSERT_EQ(x, 0.0f);
  for (float x : l) ASSERT_EQ(x, kNegInf);
}

TEST(AttentionMerge, BackwardMatchesFiniteDifferences) {
  const int N = 3, H = 2, D = 4, R = N * H;
  const std::vector<float> oa = random_floats(R * D, 1), ob = random_floats(R * D, 2);
  const std::vector<float> la = random_floats(R, 3, -2.f, 2.f), lb = random_floats(R, 4, -2.f, 2.f);
  const std::vector<float> g = random_floats(R * D, 5), gl = random_floats(R, 6);
  std::vector<float> o(R * D), l(R);
  loom::cpu::attention_merge(o.data(), l.data(), oa.data(), la.data(), ob.data(), lb.data(), N, H,
                             D);
  std::vector<float> doa(R * D), dla(R), dob(R * D), dlb(R);
  loom::cpu::attention_merge_backward(doa.data(), dla.data(), dob.data(), dlb.data(), g.data(),
                                      gl.data(), o.data(), l.data(), oa.data(), la.data(),
                                      ob.data(), lb.data(), N, H, D);
  // f(all inputs packed as [oa | la | ob | lb]) = <out, g> + <lse, gl>, in float64.
  auto f = [&](const Vec& x) {
    const double* xa = x.data();
    const double* xla = xa + R * D;
    const double* xb = xla + R;
    const double* xlb = xb + R * D;
    double s = 0.0;
    for (int i = 0; i < R; ++i) {
      const double m = std::max(xla[i], xlb[i]);
      const double L = m + std::log(std::exp(xla[i] - m) + std::exp(xlb[i] - m));
      s += L * gl[i];
      for (int d = 0; d < D; ++d)
        s += (std::exp(xla[i] - L) * xa[i * D + d] + std::exp(xlb[i] - L) * xb[i * D + d]) *
             g[i * D + d];
    }
    return s;
  };
  Vec x;
  for (const auto* v : {&oa, &la, &ob, &lb}) x.insert(x.end(), v->begin(), v->end());
  const Vec num = loom::test::numeric_gradient(f, x);
  std::vector<float> got;
  for (const auto* v : {&doa, &dla, &dob, &dlb}) got.insert(got.end(), v->begin(), v->end());
  EXPECT_TRUE(all_close(got, num, 1e-6, 1e-5));
}

TEST(CpShard, RoundTripBalanceAndLayout) {
  const std::vector<int32_t> cu = {0, 16, 24, 48};
  const int N = 48, C = 3;
  const std::vector<float> x = random_floats(N * C, 9);
  for (int cp : {1, 2, 4}) {
    SCOPED_TRACE(loom::cat("cp=", cp));
    std::vector<int> owner(N, -1);
    std::vector<float> back(N * C, std::numeric_limits<float>::quiet_NaN());
    std::vector<int64_t> work(cp, 0);
    for (int r = 0; r < cp; ++r) {
      const auto sh = loom::cpu::cp_shard(cu.data(), 3, cp, r);
      EXPECT_EQ(sh.rows(), N / cp);
      EXPECT_EQ(sh.pieces.size(), 6u);
      for (int i = 0; i < sh.rows(); ++i) {
        const int g = sh.global_rows[i];
        EXPECT_EQ(owner[g], -1) << "row " << g << " on two ranks";
        owner[g] = r;
        work[r] += sh.positions[i] + 1;  // causal work of a query ~ keys it sees
      }
      std::vector<float> local(sh.rows() * C);
      loom::cpu::cp_gather_rows(local.data(), x.data(), sh, C);
      loom::cpu::cp_scatter_rows(back.data(), local.data(), sh, C);
      // Both pieces of a document are adjacent locally, and the local causal mask is right:
      // every position of the first piece precedes every position of the second.
      for (size_t d = 0; d < 3; ++d) {
        const auto& a = sh.pieces[2 * d];
        const auto& b = sh.pieces[2 * d + 1];
        EXPECT_EQ(a.local_begin, sh.local_cu_seqlens[d]);
        EXPECT_EQ(b.local_begin, a.local_begin + a.len);
        EXPECT_EQ(sh.local_cu_seqlens[d + 1], b.local_begin + b.len);
        EXPECT_LT(a.doc_pos + a.len - 1, b.doc_pos);
        EXPECT_EQ(loom::cpu::cp_block_mask(b, a), loom::cpu::BlockMask::Full);
        EXPECT_EQ(loom::cpu::cp_block_mask(a, b), loom::cpu::BlockMask::None);
        EXPECT_EQ(loom::cpu::cp_block_mask(a, a), loom::cpu::BlockMask::Causal);
      }
    }
    for (int g = 0; g < N; ++g) EXPECT_GE(owner[g], 0) << "row " << g << " on no rank";
    EXPECT_EQ(0, std::memcmp(back.data(), x.data(), x.size() * sizeof(float)));
    for (int r = 1; r < cp; ++r) EXPECT_EQ(work[r], work[0]) << "rank " << r;
  }
  // cp = 2, document 0 (16 tokens, chunks of 4): rank 0 holds chunks 0 and 3.
  const auto sh = loom::cpu::cp_shard(cu.data(), 3, 2, 0);
  EXPECT_EQ(std::vector<int32_t>(sh.global_rows.begin(), sh.global_rows.begin() + 8),
            (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(sh.pieces[2].global_begin, 16);  // document 1 (8 tokens): chunk 0 = row 16
  EXPECT_EQ(sh.pieces[3].global_begin, 22);  // chunk 3 = rows 22, 23
}

TEST(CpShard, ErrorsNameTheSequence) {
  const std::vector<int32_t> cu = {0, 16, 26};
  try {
    loom::cpu::cp_shard(cu.data(), 2, 2, 0);
    FAIL() << "expected an error";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 1 has 10 tokens, not divisible by 2*cp = 4"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("(e.g. 12)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(loom::cpu::cp_shard(cu.data(), 1, 2, 2), loom::Error);
  EXPECT_THROW(loom::cpu::cp_shard(cu.data(), 1, 0, 0), loom::Error);
}

}  // namespace
