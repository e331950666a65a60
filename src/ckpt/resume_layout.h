// Which layout wrote a run directory's newest checkpoint. One run directory can hold both
// kinds: the one-process layout (<out_dir>/checkpoints/step_*) and per-rank parts with their
// global commit records (<out_dir>/checkpoints/rank_*, committed/), when a run is resumed under
// another number of ranks. A resume starts from the newest step of either kind, so that
// changing the layout never drops the progress made under the other.
#pragma once

#include <cstdint>
#include <string>

namespace loom::ckpt {

struct LayoutChange {
  enum Kind {
    None,            // the newest checkpoint (if any) is of this run's kind: the usual resume
    FromOneProcess,  // a distributed run; the newest is a one-process checkpoint
    FromRanks,       // a one-process run; the newest is a distributed step
  };
  Kind kind = None;
  int64_t step = -1;
  int ranks = 0;       // FromRanks: the parts in its global commit record
  std::string layout;  // FromRanks: its layout name
};

// `whole`: this run writes the one-process layout. Reads `checkpoints_dir`'s step directories
// and global commit records (those that cannot be read are passed over, as a resume does).
LayoutChange find_layout_change(const std::string& checkpoints_dir, bool whole);

}  // namespace loom::ckpt
