#include "model/grad_zeroing.h"

#include <algorithm>

#include "core/error.h"

namespace loom {

void GradZeroing::allow(int64_t lo, int64_t hi) {
  LOOM_CHECK(0 <= lo && lo < hi, "GradZeroing::allow: empty or negative range [", lo, ", ", hi,
             ")");
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), Range{lo, hi});
  if (it != ranges_.end() && *it == Range{lo, hi}) return;
  const bool clash_next = it != ranges_.end() && it->first < hi;
  const bool clash_prev = it != ranges_.begin() && std::prev(it)->second > lo;
  LOOM_CHECK(!clash_next && !clash_prev, "GradZeroing::allow: [", lo, ", ", hi,
             ") overlaps another lazily zeroed gradient range");
  // A new range was zeroed by the last zero() (it skipped nothing there): not pending.
  pending_.insert(pending_.begin() + (it - ranges_.begin()), 0);
  ranges_.insert(it, Range{lo, hi});
}

void GradZeroing::zero(int64_t total, const Fill& fill) {
  int64_t at = 0;
  for (const auto& [lo, hi] : ranges_) {
    LOOM_CHECK(hi <= total, "GradZeroing: range [", lo, ", ", hi, ") beyond the ", total,
               " gradients");
    if (lo > at) fill(at, lo);
    at = hi;
  }
  if (total > at) fill(at, total);
  std::fill(pending_.begin(), pending_.end(), 1);
}

void GradZeroing::overwritten(int64_t lo, int64_t hi) {
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), Range{lo, hi});
  if (it != ranges_.end() && *it == Range{lo, hi}) pending_[size_t(it - ranges_.begin())] = 0;
}

int GradZeroing::settle(int64_t lo, int64_t hi, const Fill& fill) {
  int filled = 0;
  for (size_t i = 0; i < ranges_.size(); ++i)
    if (pending_[i] && ranges_[i].first < hi && lo < ranges_[i].second) {
      fill(ranges_[i].first, ranges_[i].second);
      pending_[i] = 0;
      ++filled;
    }
  return filled;
}

bool GradZeroing::pending(int64_t lo, int64_t hi) const {
  for (size_t i = 0; i < ranges_.size(); ++i)
    if (pending_[i] && ranges_[i].first < hi && lo < ranges_[i].second) return true;
  return false;
}

}  // namespace loom
