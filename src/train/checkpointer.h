// A training run's checkpoints: save (synchronous, or from a host snapshot by a background
// writer), the global commit of a distributed run's per-rank parts, resume (the run's own
// newest checkpoint, or after a rollback), train.init_from (a one-process checkpoint under any
// layout) and train.pretrained (weights only). One process over a one-rank world holding every
// whole tensor writes the one-process layout; every other layout one part per rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_writer.h"
#include "train/batch.h"
#include "train/train_setup.h"

namespace loom {

class Checkpointer {
 public:
  // `step` is the run's step counter (saved, and set by a resume); `data` the training data,
  // whose position a checkpoint records; `config_text` the run's config as saved.
  Checkpointer(TrainSetup& s, BatchSource& data, int64_t& step, std::string config_text)
      : s_(s), data_(data), step_(step), config_text_(std::move(config_text)) {}

  void save();
  // Waits until the last checkpoint is durable and committed.
  void finish();
  // Seconds the last save() held up training (the snapshot when asynchronous).
  double last_stall() const;
  // The run's own newest checkpoint (distributed: committed by every rank, verifying on every
  // rank), if it has one; false when there is none.
  bool resume();
  bool resume_from(const std::string& path);  // a step dir or a checkpoints root (one process)
  // train.init_from: a one-process checkpoint's state and weights placed in this run's layout
  // (weights only when it holds no training state).
  void start_from(const std::string& path);

 private:
  ckpt::TrainerState checkpoint_state(int64_t optimizer_steps) const;
  int64_t restore_state(const ckpt::Checkpoint& c, bool same_layout = true);
  void restore(const ckpt::Checkpoint& c);
  void commit_distributed();
  bool resume_distributed();
  // The newest checkpoint is another layout's (checkpointer_layout_resume.cpp): continued
  // through start_from() or a consolidation, or refused naming both layouts.
  bool resume_across_layouts();
  ckpt::TensorList optim_list() const;
  void check_same_global_batch(const ckpt::Checkpoint& c) const;

  TrainSetup& s_;
  BatchSource& data_;
  int64_t& step_;
  std::string config_text_;
  std::unique_ptr<ckpt::CheckpointWriter> writer_;  // made by the first save
};

// The model's parameters from a one-process checkpoint of the same model, into this rank's part
// of them (LoRA's frozen base, sharded under ZeRO-3; before the optimizer exists, or into its
// master slices); nothing else of it is used.
void load_pretrained(TrainSetup& s, const std::string& path);

}  // namespace loom
