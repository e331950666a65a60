#include "ckpt/resume_layout.h"

#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/global_commit.h"
#include "core/error.h"

namespace loom::ckpt {

LayoutChange find_layout_change(const std::string& checkpoints_dir, bool whole) {
  const std::vector<int64_t> own = list_checkpoint_steps(checkpoints_dir);
  const int64_t one_process = own.empty() ? -1 : own.back();
  LayoutChange ranks;
  const std::vector<int64_t> committed = list_global_commits(checkpoints_dir);
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    try {
      if (auto gc = read_global_commit(checkpoints_dir, *it)) {
        ranks.step = gc->step;
        ranks.ranks = int(gc->parts.size());
        ranks.layout = gc->layout;
        break;
      }
    } catch (const CheckpointCorrupt&) {
      // the distributed resume names it and falls back the same way
    }
  }
  LayoutChange out;
  if (whole && ranks.step > one_process) {
    out = ranks;
    out.kind = LayoutChange::FromRanks;
  } else if (!whole && one_process > ranks.step) {
    out.kind = LayoutChange::FromOneProcess;
    out.step = one_process;
  }
  return out;
}

}  // namespace loom::ckpt
