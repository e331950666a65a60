// Global commit records of distributed checkpoints. Every rank writes its part of a step under
// <out_dir>/checkpoints/rank_NNNNN/ (checkpoint.h); the step counts as committed only when rank 0
// has written <out_dir>/checkpoints/committed/step_NNNNNNNN.json after every rank reported its
// part durable. The record lists each part's commit digest (commit_digest()), so a part replaced
// later (a partial re-save of the same step) no longer matches it. A step without a record (a
// rank killed during the save) is ignored on resume. Only rank 0 reads and writes the records:
// the ranks need not share a file system.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::ckpt {

struct GlobalCommit {
  int64_t step = 0;
  std::string layout;           // the run's layout name (Trainer::layout_name())
  std::vector<uint64_t> parts;  // commit digest of rank r's part; size = world size
};

// <checkpoints_dir>/committed
std::string global_commit_dir(const std::string& checkpoints_dir);

// Writes the record atomically (fsynced) and returns its path.
std::string write_global_commit(const std::string& checkpoints_dir, const GlobalCommit& commit);

// The record of `step`, or nullopt when there is none. A record that exists but cannot be read
// throws CheckpointCorrupt naming the file.
std::optional<GlobalCommit> read_global_commit(const std::string& checkpoints_dir, int64_t step);

// Steps with a record, ascending.
std::vector<int64_t> list_global_commits(const std::string& checkpoints_dir);

// Deletes the records of steps older than `newest` whose part is gone from `rank0_root` (after
// rotation there), so the records follow rank 0's kept checkpoints.
void prune_global_commits(const std::string& checkpoints_dir, const std::string& rank0_root,
                          int64_t newest);

}  // namespace loom::ckpt
