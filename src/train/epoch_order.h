// The order in which a finite set of examples is visited: a fresh permutation every epoch,
// drawn from the counter-based RNG by (seed, epoch), or file order (validation); resumable
// from (epoch, cursor). Shared by the fine-tuning batch sources.
#pragma once

#include <cstdint>
#include <vector>

#include "core/json.h"

namespace loom {

class EpochOrder {
 public:
  EpochOrder(int64_t n, uint64_t seed, bool shuffle);
  int64_t next();   // the next example's index (a new epoch starts when one ends)
  void put_back();  // undoes the last next() of this epoch
  Json state() const;
  void restore(const Json& s);  // throws when the state does not fit n
  int64_t epoch() const { return epoch_; }

 private:
  void permute();
  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = 0, cursor_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace loom
