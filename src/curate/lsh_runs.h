// LSH bucket entries and their sorted runs on disk, shared by the one-process and the
// distributed bucket stage of fuzzy dedup. Entries sorted by (band, hash, doc) put each bucket
// in one consecutive range that starts with its smallest document; every other member of the
// range is a candidate pair with that first document.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace loom::curate {

struct BandEntry {
  uint64_t hash;
  uint32_t band, doc;
  bool operator<(const BandEntry& o) const {
    if (band != o.band) return band < o.band;
    if (hash != o.hash) return hash < o.hash;
    return doc < o.doc;
  }
};
static_assert(sizeof(BandEntry) == 16, "BandEntry is written to disk and sent between ranks raw");

using PairFn = std::function<void(uint32_t first, uint32_t other)>;

// Sorts `buf` and writes it to `path` (a run file).
void write_sorted_run(const std::string& path, std::vector<BandEntry>& buf);
// Candidate pairs of entries already sorted in memory.
void pairs_from_sorted(const std::vector<BandEntry>& sorted, const PairFn& on_pair);
// Candidate pairs of sorted run files, merged k ways in (band, hash, doc) order.
void pairs_from_runs(const std::vector<std::string>& run_files, const PairFn& on_pair);

// Reads a shard's .sig file (bands x 8 bytes per document) in pieces, so a large shard never
// has to fit in memory.
class SigReader {
 public:
  SigReader(const std::string& path, size_t rec);
  ~SigReader();
  SigReader(const SigReader&) = delete;
  SigReader& operator=(const SigReader&) = delete;
  // The next document's band hashes, or nullptr at the end of the file.
  const uint64_t* next();

 private:
  std::string path_;
  size_t rec_;
  std::FILE* f_;
  std::vector<uint64_t> buf_;
  size_t pos_ = 0, have_ = 0;
};

}  // namespace loom::curate
