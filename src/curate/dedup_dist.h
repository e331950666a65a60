// Deduplication across MPI ranks. Shard i belongs to rank i % ranks (GlobalInput::owns); each
// rank hashes or signs only its own documents, and global document numbers (shard order, then
// line order) are the same as in a one-process run, so every decision is too:
// - exact: (hash, doc) records go to the rank owning the hash's range; the first document of
//   each group of equal hashes represents it;
// - fuzzy: (band, hash, doc) entries go to the rank owning the hash's range (whole buckets land
//   on one rank), sorted in memory or spilled to sorted runs past the budget and merged; each
//   rank's buckets give its candidate pairs (each bucket's first document with each other
//   member, as in one process); optional Jaccard verification on the rank holding the pair's
//   first document; connected components by union-find on rank 0 over the documents of some
//   edge (pairs are few), the smallest document representing its component.
// Decisions then go to the ranks holding the documents, with the ids of representatives held
// elsewhere. Every function here is collective: all ranks call it, in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "curate/lsh_runs.h"
#include "curate/stage.h"
#include "curate/text.h"

namespace loom::curate {

using DocPair = std::pair<uint32_t, uint32_t>;

// What one rank knows after a distributed dedup: every shard's first global document, the ids
// of its own documents, and the fate of those of them that are in a group of more than one.
class RankDecisions {
 public:
  struct Fate {
    uint32_t rep, size;
  };
  struct Found {  // a decision found on some rank, for the rank holding `doc`
    uint32_t doc, rep, size;
  };

  // Reads this rank's shards' ids (<work_dir>/<i>.ids) and agrees on every shard's count.
  void load_ids(const GlobalInput& in);
  uint64_t begin(size_t shard) const { return offset_[shard]; }
  uint64_t end(size_t shard) const { return offset_[shard + 1]; }
  uint64_t total() const { return offset_.back(); }
  size_t shard_of(uint32_t g) const;
  int owner(uint32_t g) const {
    return static_cast<int>(shard_of(g) % static_cast<size_t>(ranks_));
  }
  const std::string& own_id(uint32_t g) const;  // g must be held by this rank
  Fate fate(uint32_t g) const;                  // {g, 1} for a document alone
  const std::string& rep_id(uint32_t g) const;  // the id of fate(g).rep
  // Sends each decision to the rank holding its document, then fetches the ids of the
  // representatives held by other ranks.
  void deliver(const GlobalInput& in, const std::vector<Found>& found);

 private:
  std::vector<uint64_t> offset_;
  std::vector<std::vector<std::string>> ids_;  // per shard; empty for other ranks' shards
  int rank_ = 0, ranks_ = 1;
  std::unordered_map<uint32_t, Fate> fate_;
  std::unordered_map<uint32_t, std::string> rep_ids_;
};

// Exact dedup groups from each rank's (hash, doc) records of its own documents.
void resolve_exact(const GlobalInput& in, const std::vector<std::pair<Hash128, uint32_t>>& mine,
                   RankDecisions& d);

// Connected components of the edges found on all ranks.
void resolve_components(const GlobalInput& in, const std::vector<DocPair>& edges, RankDecisions& d);

// The bucket stage: produce(out, max) appends up to max entries of this rank's documents
// (fewer only when they are exhausted). Entries past `budget` bytes are spilled to sorted runs
// in in.work_dir. on_pair receives this rank's candidate pairs. Returns the runs spilled here.
using EntrySource = std::function<void(std::vector<BandEntry>& out, size_t max)>;
size_t distributed_buckets(const GlobalInput& in, size_t budget, const EntrySource& produce,
                           const PairFn& on_pair);

// Exact Jaccard check of candidate pairs found on any rank. sets(docs) returns the sorted
// shingle sets of this rank's own documents `docs` (sorted, distinct). Returns the pairs that
// reach the threshold (each on one rank) and, in `distinct`, the distinct pairs checked here.
std::vector<DocPair> verify_distributed(
    const GlobalInput& in, const RankDecisions& d, const std::vector<DocPair>& pairs,
    double threshold,
    const std::function<std::vector<std::vector<uint64_t>>(const std::vector<uint32_t>&)>& sets,
    int64_t& distinct);

// Shared with the one-process code (dedup.cpp).
double sorted_jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);
std::vector<std::string> read_lines(const std::string& path);

}  // namespace loom::curate
