// Training checkpoints: one directory per step under a root,
//
//   <root>/step_00000042/model.safetensors   model parameters
//                        optim.safetensors   optimizer state (moments, master weights, ...)
//                        state.json          step, RNG, data position, config, fingerprint, extra
//                        commit.json         the commit record: sizes and XXH64 checksums of the
//                                            three files above (per tensor and header)
//   <root>/latest                            "step_00000042\n": the newest committed checkpoint
//
// A save writes <root>/step_00000042.tmp.<pid>/, fsyncs every file, writes commit.json last,
// renames the directory into place, fsyncs the root, reads the checkpoint back and verifies it,
// then replaces `latest` atomically and rotates. A crash at any point leaves the previous
// checkpoint and `latest` intact; leftover .tmp directories of dead processes are removed by the
// next save.
//
// Every load verifies the checksums (Checkpoint's constructor). Opening a root falls back from a
// checkpoint that fails (flipped bytes, truncation, a missing file) to the newest older one that
// verifies, with a warning naming the step and the file. Checkpoints written before commit
// records existed (state.json version 1) load unverified, with a warning.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/json.h"

namespace loom::ckpt {

// A checkpoint that cannot be used as stored: a missing or truncated file, a checksum mismatch,
// an unreadable state.json or commit record. Callers that can fall back to an older checkpoint
// catch this type; other errors (another model, another layout) are the caller's to report.
class CheckpointCorrupt : public Error {
 public:
  using Error::Error;
};

// Everything besides tensors that a run needs to continue bit-identically.
struct TrainerState {
  int64_t step = 0;
  uint64_t seed = 0;
  Json rng = Json::object();    // RNG counters/offsets beyond the seed
  Json data = Json::object();   // data-loader position (epoch, sample index, shuffle state...)
  std::string config_text;      // the resolved config of the run
  std::string fingerprint;      // model-shape fingerprint; empty on save: shape_fingerprint(model)
  Json extra = Json::object();  // anything else the trainer wants back (loss scale, metrics...)
};

Json trainer_state_to_json(const TrainerState& s);
TrainerState trainer_state_from_json(const Json& j, const std::string& where);

// Stable hash of tensor names and global shapes, independent of how tensors are sharded.
std::string shape_fingerprint(const TensorList& tensors);
std::string shape_fingerprint(const TensorMap& tensors);

std::string step_dir_name(int64_t step);                           // "step_00000042"
bool parse_step_dir_name(const std::string& name, int64_t* step);  // false for other names
// A distributed run's per-rank checkpoint root under <out_dir>/checkpoints: "rank_00003".
std::string rank_dir_name(int rank);

// Writes the checkpoint for `state.step` under `root` (created if missing), verifies it as
// stored, updates `latest`, and, with keep_last > 0, then rotates (prune_checkpoints). When the
// written checkpoint does not verify, it throws CheckpointCorrupt before `latest` or rotation
// touch anything, so the newest checkpoint that verified is never deleted. Re-saving an existing
// step replaces it atomically. Returns the committed directory.
std::string save_checkpoint(const std::string& root, const TrainerState& state,
                            const TensorList& model, const TensorList& optim, int keep_last = 0);
std::string save_checkpoint(const std::string& root, const TrainerState& state,
                            const TensorMap& model, const TensorMap& optim, int keep_last = 0);

// Deletes step directories older than `newest` so that keep_last remain, counting `newest`.
// Directories of steps later than `newest` (an abandoned future after a rollback) are never
// deleted. Distributed runs call it once a step is globally committed.
void prune_checkpoints(const std::string& root, int64_t newest, int keep_last);

// Committed step directories under `root`, ascending (empty if root does not exist).
std::vector<int64_t> list_checkpoint_steps(const std::string& root);

// True when `root` holds a `latest` or any step directory: a run that has something to resume.
bool has_checkpoints(const std::string& root);

// Checks a step directory against its commit record: every file present, sizes and checksums
// equal. Throws CheckpointCorrupt naming the step, the file and (for a tensor) its name.
// Legacy checkpoints without a commit record pass with a warning.
void verify_checkpoint(const std::string& step_dir);

// XXH64 of a step directory's commit record: one number that stands for the whole checkpoint
// (a distributed run's global commit record lists it per rank). Throws CheckpointCorrupt.
uint64_t commit_digest(const std::string& step_dir);

// The directory <root>/latest names, or nullopt when there is no `latest` (a fresh run).
// Throws when `latest` is malformed or names a directory that does not exist.
std::optional<std::string> find_latest_checkpoint(const std::string& root);

// Throws naming `file` and the first tensor, in name order, that is missing on either side or
// whose shape (or shard placement) differs, with both shapes. With check_dtype, dtypes too
// (with widen, a bf16 or fp16 tensor where fp32 is expected passes: it widens exactly).
void check_tensors_match(const SafetensorsReader& file, const TensorList& expected,
                         bool check_dtype = true, bool widen = false);

// An opened checkpoint: state.json parsed and both tensor files mapped and validated.
class Checkpoint {
 public:
  // `path` is a step directory (holding state.json) or a root holding `latest`. A step
  // directory that fails verification throws CheckpointCorrupt; a root opens the newest
  // checkpoint at or before `latest` that verifies (warning about each one skipped) and throws
  // when none does.
  explicit Checkpoint(const std::string& path);

  const std::string& dir() const { return dir_; }
  const TrainerState& state() const { return state_; }
  const SafetensorsReader& model() const { return *model_; }
  const SafetensorsReader& optim() const { return *optim_; }

  // Copy the stored tensors into the caller's (views into its buffers) after checking that
  // names, shapes, dtypes and shard placement match exactly; a non-empty expected_fingerprint
  // must also equal the stored one. Nothing is written unless everything matches.
  void restore_model(const TensorList& dst, const std::string& expected_fingerprint = "") const;
  void restore_model(const TensorMap& dst, const std::string& expected_fingerprint = "") const;
  void restore_optim(const TensorList& dst) const;
  void restore_optim(const TensorMap& dst) const;

 private:
  void open(const std::string& dir);  // opens and verifies one step directory
  std::string dir_;
  TrainerState state_;
  std::unique_ptr<SafetensorsReader> model_, optim_;
};

}  // namespace loom::ckpt
