// Saving checkpoints without stalling training (train.ckpt_async): save() copies the state into
// host snapshot buffers and returns; a background thread writes, verifies and commits them
// through save_checkpoint (checkpoint.h), so the commit happens only once the files are durable
// and a crash mid-write leaves the previous checkpoint intact. At most one write is in flight: the
// next save() waits for the previous one, up to a timeout. Synchronous mode writes in save().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/checkpoint.h"

namespace loom::ckpt {

struct CheckpointWriterOptions {
  bool async = false;
  int keep_last = 0;       // rotation after each save; 0 = none (distributed runs rotate later)
  double timeout_s = 600;  // how long a save waits for the previous background write
  bool quiet = false;
};

class CheckpointWriter {
 public:
  // What a finished save left on disk.
  struct Written {
    int64_t step = 0;
    std::string dir;
    uint64_t digest = 0;  // commit_digest(dir): the part's entry in a global commit record
    double write_seconds = 0;
  };

  CheckpointWriter(std::string root, CheckpointWriterOptions options);
  // Waits for a write in flight (up to the timeout) and logs its failure: a destructor must not
  // throw. Callers that need the outcome call wait() first.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves `state` with copies of `model` and `optim` as they are now. Async: first waits for the
  // previous write (rethrowing its error; throwing if it takes longer than the timeout), then
  // snapshots and returns while the write goes on. The tensors may change as soon as it returns.
  void save(const TrainerState& state, const TensorList& model, const TensorList& optim);

  // The outcome of the saves since the last wait(): the newest one once it is durable and
  // committed, or nullopt when there was none. Rethrows a failed write's error.
  std::optional<Written> wait();

  // Seconds the last save() held up its caller (the training stall of one checkpoint).
  double last_stall_seconds() const { return stall_s_; }
  const std::string& root() const { return root_; }

 private:
  struct Job;
  void reap(bool quietly);  // waits for the job in flight and moves its outcome to done_

  std::string root_;
  CheckpointWriterOptions opt_;
  std::shared_ptr<Job> job_;    // the write in flight (async), shared with its thread
  std::shared_ptr<Job> spare_;  // a finished job whose snapshot buffers the next save reuses
  std::optional<Written> done_;
  std::exception_ptr error_;
  double stall_s_ = 0;
};

}  // namespace loom::ckpt
