// The trainer's side of the loss guard (train/loss_guard.h): what a spike or a run of skipped
// steps does to the run. Apart from trainer.cpp so that the guard's policy reads in one place.
#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/log.h"
#include "train/trainer.h"

namespace loom {

bool Trainer::guard_step(const StepResult& r) {
  const LossGuard::Result g = guard_->observe(step_, r.loss, r.skipped);
  if (g.verdict == LossGuard::Verdict::Ok) return false;
  SpikeAction action = guard_->options().on_spike;
  // Skipped steps never move the weights: training on after max_bad_steps of them would only
  // skip more, so "warn" stops there as it always did.
  if (g.verdict == LossGuard::Verdict::Diverged && action == SpikeAction::Warn)
    action = SpikeAction::Stop;
  if (action == SpikeAction::Warn) {
    if (s_->rank == 0) log_warn(g.message, "; training on (train.on_spike = warn)");
    return false;
  }
  // This step's checkpoint is never written (the check runs before the save), so the newest
  // checkpoint on disk stays the last one from before the spike, and rotation keeps it.
  if (action == SpikeAction::Stop)
    fail("stopping: ", g.message, "; no checkpoint of this step is written, so the newest one ",
         "on disk stays (train.on_spike = ", spike_action_name(guard_->options().on_spike), ")");
  LOOM_CHECK(rollbacks_ < guard_->options().max_rollbacks, "stopping: ", g.message,
             "; already rolled back ", rollbacks_,
             " time(s) (train.max_rollbacks = ", guard_->options().max_rollbacks,
             "); the newest checkpoint on disk stays");
  roll_back(g.message);
  return true;
}

// Restores the newest checkpoint that verifies (every rank alike when distributed) and moves the
// data on past the offending step: each rank's data position is the one after the bad step, so
// the batches between the checkpoint and the spike are skipped (Megatron skips the bad batch;
// which of those batches hurt is unknown here, so all of them go).
void Trainer::roll_back(const std::string& why) {
  const int64_t bad_step = step_;
  const Json data_after = train_data_->state();
  finish_checkpoints();  // an asynchronous write in flight is from before the spike: keep it
  const bool restored = ckpt_->resume();
  LOOM_CHECK(restored, "stopping: ", why, "; no checkpoint to roll back to under ",
             checkpoint_root(), " (train.on_spike = rollback needs one: set ",
             "train.checkpoint_interval)");
  train_data_->restore(data_after);
  ++rollbacks_;
  guard_->rolled_back();
  if (metrics_) {  // the steps after the checkpoint run again: drop their rows
    const std::string path = metrics_->path();
    metrics_.reset();
    metrics_ = std::make_unique<MetricsLog>(
        path, true, opt_.tensorboard ? opt_.out_dir + "/tensorboard" : "", step_);
  }
  if (s_->rank == 0)
    log_warn(why, ": rolled back to the checkpoint of step ", step_, " (rollback ", rollbacks_,
             " of ", guard_->options().max_rollbacks, "); the data of steps ", step_ + 1, " to ",
             bad_step, " is skipped (train.on_spike = rollback)");
}

}  // namespace loom
