// Deduplication. Exact: a 128-bit hash of the normalised text, the first document (in shard,
// then line order) kept. Fuzzy: MinHash signatures over word or character n-grams, LSH
// banding (b bands x r rows), connected components with union-find, one document kept per
// cluster (the first), every kept document annotated with its cluster id and size.
// Signatures are computed per shard in parallel and spilled to work files, so a resumed run
// does not recompute them; candidate pairs come from sorting (band hash, doc) per band in
// memory, or, past the stage's memory budget, from sorted runs on disk merged k ways. Candidate
// pairs can be checked by the exact Jaccard similarity of their recomputed shingle sets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::curate {

struct MinHashParams {
  std::string shingle = "word";  // word | char
  int ngram = 5;
  int bands = 14, rows = 8;
  uint64_t seed = 42;
};

class MinHasher {
 public:
  explicit MinHasher(const MinHashParams& p);
  int num_perm() const { return p_.bands * p_.rows; }
  // Hashes of the text's shingles (lowercased, punctuation stripped for words).
  std::vector<uint64_t> shingles(std::string_view text) const;
  std::vector<uint32_t> signature(std::string_view text) const;
  std::vector<uint64_t> band_hashes(const std::vector<uint32_t>& sig) const;
  const MinHashParams& params() const { return p_; }

 private:
  MinHashParams p_;
  std::vector<uint32_t> a_, b_;
};

double signature_similarity(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);
// Probability that two documents with Jaccard similarity s share at least one band.
double lsh_probability(double s, int bands, int rows);

// Union-find over document indices where a component's root is its smallest index, so the
// kept document of a cluster is the first one seen.
class UnionFind {
 public:
  explicit UnionFind(size_t n);
  uint32_t find(uint32_t x);
  void unite(uint32_t a, uint32_t b);

 private:
  std::vector<uint32_t> parent_;
};

}  // namespace loom::curate
