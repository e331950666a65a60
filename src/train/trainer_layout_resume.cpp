// The trainer's resume across a change of layout (ckpt/resume_layout.h): a run directory whose
// newest checkpoint another layout wrote. A distributed run continues from a one-process
// checkpoint through train.init_from's path (each rank extracts its pieces, ckpt/reshard.h); a
// one-process run continues from a distributed step consolidated into one checkpoint
// (ckpt/consolidate.h). Both keep the step, the optimizer state and the data position, and
// both refuse another global batch or sequence length (check_same_global_batch). A change
// between two distributed layouts stays refused by the distributed resume, naming both: its
// ranks need not share a file system, so no one process can read every part.
#include <filesystem>

#include "ckpt/consolidate.h"
#include "comm/process_groups.h"
#include "ckpt/resume_layout.h"
#include "core/error.h"
#include "core/log.h"
#include "train/trainer.h"

namespace loom {

bool Trainer::resume_across_layouts() {
  comm::Communicator& w = pg_->world();
  const std::string shared = opt_.out_dir + "/checkpoints";
  ckpt::LayoutChange change;
  if (rank_ == 0) change = ckpt::find_layout_change(shared, whole_);
  int64_t rec[2] = {int64_t(change.kind), change.step};
  w.broadcast(rec, 2, DType::I64, 0);
  if (rec[0] == ckpt::LayoutChange::None) return false;
  if (rec[0] == ckpt::LayoutChange::FromOneProcess) {
    if (rank_ == 0 && !opt_.quiet)
      log_info(shared, ": the newest checkpoint, step ", rec[1],
               ", is a one-process one: every rank starts from it (", layout_name(), ")");
    start_from_one_process(shared);
    return true;
  }
  // FromRanks: this run is one process (whole_), so rank 0 is all of it.
  const std::string one = shared + "/consolidated";
  if (!opt_.quiet)
    log_info(shared, ": the newest checkpoint, step ", change.step, ", was committed by ",
             change.ranks, " ranks (", change.layout, "): consolidating it into ", one,
             " to continue as one process");
  std::error_code ec;
  std::filesystem::remove_all(one, ec);  // an earlier consolidation's, of an older step
  try {
    ckpt::consolidate({shared, one, change.step});
  } catch (const Error& e) {
    fail(shared, ": the newest checkpoint, step ", change.step, ", was committed by ",
         change.ranks, " ranks (", change.layout, ") and cannot be consolidated to resume as one ",
         "process: ", e.what(), "; resume it under its own layout instead");
  }
  start_from_one_process(one);
  return true;
}

}  // namespace loom
