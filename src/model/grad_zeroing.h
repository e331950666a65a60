// Lazy gradient zeroing: ParamSet::zero_grad() skips the ranges whose first write after it
// overwrites them whole (the bf16 weight-gradient GEMMs write dW with beta = 0 after a
// zero_grad), instead of filling 500 MB of zeros that are overwritten before anyone reads them
// (GPT-2 124M: every linear weight, ~99% of the gradient buffer). A skipped range is "pending"
// until its writer says it overwrote it; whatever reads gradients settles first (fills the
// still-pending ranges it reads with zeros), so a linear that got no rows in a step (an MoE
// expert without tokens, an empty micro-batch, a layer not run) still reads zero, never the
// previous step's gradient.
//
// Bookkeeping only: the caller passes the fill (a Backend op on the gradient buffer).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace loom {

class GradZeroing {
 public:
  using Range = std::pair<int64_t, int64_t>;  // [lo, hi) in elements of the gradient buffer
  using Fill = std::function<void(int64_t lo, int64_t hi)>;

  // [lo, hi) is overwritten whole by its first write after every zero() (never accumulated
  // onto): later zero() calls skip it. A range already allowed is kept once; one overlapping
  // another allowed range differently is an error (two writers over one range cannot both be
  // the first).
  void allow(int64_t lo, int64_t hi);
  // Zero [0, total): fill every part outside the allowed ranges now, mark the allowed ones
  // pending.
  void zero(int64_t total, const Fill& fill);
  // The writer is about to overwrite [lo, hi) whole (an allowed range): no longer pending.
  // A range that was never allowed is ignored (it was filled by zero()).
  void overwritten(int64_t lo, int64_t hi);
  // Fill every pending range that overlaps [lo, hi) (whole: the parts outside are zeros due
  // as well) and mark it settled. Returns how many ranges it filled.
  int settle(int64_t lo, int64_t hi, const Fill& fill);
  // Whether any pending range overlaps [lo, hi).
  bool pending(int64_t lo, int64_t hi) const;
  size_t allowed() const { return ranges_.size(); }

 private:
  std::vector<Range> ranges_;  // sorted by lo, disjoint
  std::vector<char> pending_;  // per range
};

}  // namespace loom
