// MinHash LSH: on generated near-duplicate pairs with known Jaccard similarity, the fraction
// detected must match the banding formula 1-(1-s^r)^b.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "curate/dedup.h"

using namespace loom::curate;

static double jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  std::set<uint64_t> sa(a.begin(), a.end()), sb(b.begin(), b.end());
  size_t inter = 0;
  for (auto x : sa) inter += sb.count(x);
  return static_cast<double>(inter) / static_cast<double>(sa.size() + sb.size() - inter);
}

static bool shares_band(const MinHasher& h, const std::string& a, const std::string& b) {
  auto ba = h.band_hashes(h.signature(a)), bb = h.band_hashes(h.signature(b));
  for (size_t i = 0; i < ba.size(); ++i)
    if (ba[i] == bb[i]) return true;
  return false;
}

struct PairStats {
  double expected = 0, variance = 0;
  int observed = 0, pairs = 0;
  int high_total = 0, high_found = 0, low_total = 0, low_found = 0;
};

static PairStats run_pairs(const MinHasher& h, int npairs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  PairStats st;
  for (int p = 0; p < npairs; ++p) {
    std::vector<std::string> words(200);
    for (auto& w : words) w = "w" + std::to_string(rng() % 1000000);
    auto join = [](const std::vector<std::string>& ws) {
      std::string s;
      for (auto& w : ws) s += w + " ";
      return s;
    };
    std::string a = join(words);
    int edits = 1 + p % 40;  // from a single edit to Jaccard well below 0.3
    for (int e = 0; e < edits; ++e)
      words[rng() % words.size()] = "e" + std::to_string(rng() % 1000000);
    std::string b = join(words);
    double s = jaccard(h.shingles(a), h.shingles(b));
    double prob = lsh_probability(s, h.params().bands, h.params().rows);
    bool found = shares_band(h, a, b);
    st.expected += prob;
    st.variance += prob * (1 - prob);
    st.observed += found;
    ++st.pairs;
    if (s >= 0.9) {
      ++st.high_total;
      st.high_found += found;
    }
    if (s <= 0.3) {
      ++st.low_total;
      st.low_found += found;
    }
  }
  return st;
}

TEST(MinHash, DetectionRateMatchesTheLshFormula) {
  MinHasher h(MinHashParams{});  // word 5-grams, 14 bands x 8 rows
  PairStats st = run_pairs(h, 400, 7);
  double sigma = std::sqrt(st.variance);
  EXPECT_NEAR(st.observed, st.expected, 4 * sigma + 3)
      << "observed " << st.observed << " expected " << st.expected;
  ASSERT_GT(st.high_total, 10);
  ASSERT_GT(st.low_total, 10);
  EXPECT_EQ(st.high_found, st.high_total);  // recall ~1 at s >= 0.9 (p > 0.9999)
  EXPECT_LE(st.low_found, 1);               // precision: p < 0.001 at s <= 0.3
}

TEST(MinHash, NemoPresetCharacterShingles) {
  MinHashParams p;
  p.shingle = "char";
  p.ngram = 24;
  p.bands = 20;
  p.rows = 13;
  MinHasher h(p);
  EXPECT_EQ(h.num_perm(), 260);
  PairStats st = run_pairs(h, 200, 9);
  EXPECT_NEAR(st.observed, st.expected, 4 * std::sqrt(st.variance) + 3);
}

TEST(MinHash, SignatureSimilarityEstimatesJaccard) {
  MinHashParams p;
  p.bands = 32;
  p.rows = 8;  // 256 permutations: standard error ~0.03
  MinHasher h(p);
  std::string a, b;
  for (int i = 0; i < 300; ++i) a += "tok" + std::to_string(i) + " ";
  for (int i = 0; i < 300; ++i) b += (i % 10 == 0 ? "alt" : "tok") + std::to_string(i) + " ";
  double s = jaccard(h.shingles(a), h.shingles(b));
  EXPECT_NEAR(signature_similarity(h.signature(a), h.signature(b)), s, 0.12);
  EXPECT_EQ(signature_similarity(h.signature(a), h.signature(a)), 1.0);
}

TEST(UnionFind, RootIsTheSmallestIndex) {
  UnionFind uf(6);
  uf.unite(5, 3);
  uf.unite(3, 4);
  uf.unite(1, 2);
  EXPECT_EQ(uf.find(5), 3u);
  EXPECT_EQ(uf.find(4), 3u);
  uf.unite(4, 1);
  EXPECT_EQ(uf.find(5), 1u);
  EXPECT_EQ(uf.find(0), 0u);
}
