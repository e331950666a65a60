// How data parallelism cuts a flat run of parameters over ranks: [base, base + n) in contiguous
// shards of ceil(n / ranks) elements (the last ranks may hold fewer or none), so no tensor needs
// to divide by the group's size. The gradient reduction, the sharded optimizer and the
// parameter gathering of DataParallel all place elements by it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace loom::parallel {

struct FlatShards {
  int64_t base = 0, n = 0, shard = 0;
  int ranks = 1;

  FlatShards() = default;
  FlatShards(int64_t base_, int64_t n_, int ranks_)
      : base(base_), n(n_), shard((n_ + ranks_ - 1) / ranks_), ranks(ranks_) {}
  int64_t begin(int r) const { return base + std::min(int64_t(r) * shard, n); }
  int64_t end(int r) const { return base + std::min(int64_t(r) * shard + shard, n); }
  // Per rank: how many elements of [lo, hi) its shard holds (the counts of a reduce-scatter or
  // all-gather of that range).
  std::vector<int64_t> counts_of(int64_t lo, int64_t hi) const {
    std::vector<int64_t> c(size_t(ranks), 0);
    for (int r = 0; r < ranks; ++r)
      c[size_t(r)] = std::max<int64_t>(0, std::min(hi, end(r)) - std::max(lo, begin(r)));
    return c;
  }
};

}  // namespace loom::parallel
