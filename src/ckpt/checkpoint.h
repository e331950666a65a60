// Training checkpoints: one directory per step under a root,
//
//   <root>/step_00000042/model.safetensors   model parameters
//                        optim.safetensors   optimizer state (moments, master weights, ...)
//                        state.json          step, RNG, data position, config, fingerprint, extra
//   <root>/latest                            "step_00000042\n": the newest committed checkpoint
//
// A save writes <root>/step_00000042.tmp.<pid>/, fsyncs every file, renames the directory into
// place, fsyncs the root, then replaces `latest` atomically. A crash at any point leaves the
// previous checkpoint and `latest` intact; leftover .tmp directories of dead processes are
// removed by the next save.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/json.h"

namespace loom::ckpt {

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

// Writes the checkpoint for `state.step` under `root` (created if missing), updates `latest`,
// and, with keep_last > 0, then deletes older step directories so that keep_last remain,
// counting the new one. Directories of steps later than state.step (an abandoned future after a
// rollback) are never deleted. Re-saving an existing step replaces it atomically.
// Returns the committed directory.
std::string save_checkpoint(const std::string& root, const TrainerState& state,
                            const TensorList& model, const TensorList& optim, int keep_last = 0);
std::string save_checkpoint(const std::string& root, const TrainerState& state,
                            const TensorMap& model, const TensorMap& optim, int keep_last = 0);

// Committed step directories under `root`, ascending (empty if root does not exist).
std::vector<int64_t> list_checkpoint_steps(const std::string& root);

// The directory <root>/latest names, or nullopt when there is no `latest` (a fresh run).
// Throws when `latest` is malformed or names a directory that does not exist.
std::optional<std::string> find_latest_checkpoint(const std::string& root);

// Throws naming `file` and the first tensor, in name order, that is missing on either side or
// whose shape (or shard placement) differs, with both shapes. With check_dtype, dtypes too.
void check_tensors_match(const SafetensorsReader& file, const TensorList& expected,
                         bool check_dtype = true);

// An opened checkpoint: state.json parsed and both tensor files mapped and validated.
class Checkpoint {
 public:
  // `path` is a step directory (holding state.json) or a root holding `latest`.
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
  std::string dir_;
  TrainerState state_;
  std::unique_ptr<SafetensorsReader> model_, optim_;
};

}  // namespace loom::ckpt
