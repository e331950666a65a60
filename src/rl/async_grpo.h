// Asynchronous GRPO in one process: a rollout thread (the serving engine over its own copy of
// the weights) and the learner overlap, joined by the versioned replay buffer. Weight version v
// is the policy after v learner steps. The rollout thread makes the groups of target step s from
// the newest published version v, and starts them only once s - v <= max_staleness, so it runs
// at most max_staleness steps ahead; the learner at step s takes the groups of s from the buffer
// (waiting at most learner_timeout seconds), steps, and publishes version s + 1. The rollout
// thread picks new weights up between generation batches: rollouts in flight finish on the
// weights they started with and are tagged with that version (no partial rollouts), and the
// learner corrects them with truncated importance weights. With max_staleness = 0 every batch is
// generated from the learner's current weights: the synchronous algorithm, step for step.
// Each role runs its kernels on threads_per_role OpenMP/BLAS threads, so on 2 cores the two
// really overlap (one core each). With RlOptions::learner_share > 0 the rollout thread, while it
// waits for new weights, is the learner's LearnerHelper: its copy of the weights holds the
// learner's version right after a publish, so it runs the forward and backward of that share of
// the step's batch, and the learner adds its gradients (the learner computes a share no one took
// itself; the learner is the slower role, so this balances the two).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/buffer.h"
#include "rl/grpo_trainer.h"
#include "rl/replay_buffer.h"
#include "rl/rollout.h"

namespace loom::rl {

struct AsyncOptions {
  int64_t max_staleness = 1;     // rl.max_staleness (NeMo RL's max_trajectory_age_steps)
  double learner_timeout = 600;  // seconds either side waits for the other before failing
  int threads_per_role = 0;      // 0: half the cores each (at least 1)
  // Instrumentation for tests: called on the rollout thread before each batch (target step) and
  // on the learner before each step.
  std::function<void(int64_t)> before_rollout, before_learn;
  // Instrumentation for tests (learner_share): called on the learner right after it offers a
  // share, before its own part; and help_any_time makes the rollout thread take an offer however
  // late it sees it (by default it declines one it could not finish before the learner's part).
  std::function<void(int64_t)> after_offer;
  bool help_any_time = false;
  // A resume: the checkpoint's buffered groups (rl_checkpoint.h), restored before the rollout
  // thread starts; it then generates from the step after the last of them.
  std::vector<BufferedStep> resume_buffer;
  // With partial rollouts: the checkpoint's unfinished groups, continued by the rollout thread's
  // first batch (they target the step after the last buffered one).
  std::vector<PromptGroup> resume_carry;
};

class AsyncGrpo : private LearnerHelper {
 public:
  AsyncGrpo(Decoder& policy, const data::BpeTokenizer& tok, const data::ChatTemplate& chat,
            const Environment& env, const RlOptions& opt, const AsyncOptions& async,
            const RlRestore& restore = {});
  ~AsyncGrpo();  // stops the rollout thread (after its batch in flight)
  // One learner step: waits for the groups of this step, learns, publishes the new weights.
  RlStepStats step();
  int64_t steps_taken() const { return step_; }
  GrpoLearner& learner() { return learner_; }
  ReplayStats buffer_stats() const { return buffer_.stats(); }
  int64_t buffered_groups() const { return buffer_.size(); }
  // For a checkpoint between steps: waits (at most learner_timeout) for the rollout batch in
  // flight to reach the buffer, then copies what the buffer holds, so that the checkpoint's
  // weights and buffer are one consistent cut; the rollout thread then goes on. Throws when the
  // rollout thread failed or did not finish its batch in time. With partial rollouts, *carried
  // (nullable) gets the groups cut at the same cut, which the next batch would continue.
  std::vector<BufferedStep> buffer_contents(std::vector<PromptGroup>* carried = nullptr);
  void stop();

 private:
  void rollout_loop(int64_t have);  // have: the version the snapshot holds at the start
  // LearnerHelper, for the learner; help() runs an offer on the rollout thread (mu_ held on entry
  // and on return).
  void offer(const ModelInput& in, int64_t version, double latest_start) override;
  const float* collect(double* seconds) override;
  void help(std::unique_lock<std::mutex>& lock, int64_t* have);

  RlOptions opt_;
  AsyncOptions async_;
  Decoder& policy_;
  GrpoLearner learner_;
  ReplayBuffer buffer_;
  std::unique_ptr<Decoder> snapshot_;  // the rollout side's weights
  std::unique_ptr<RolloutWorker> rollout_;
  int threads_ = 1;
  int64_t lead_ = 1;  // how far ahead of the learner new groups start (see the constructor)
  int64_t step_ = 0;

  // The published weights: the newest version and its flat fp32 parameters, in the policy
  // backend's memory (a device-to-device copy each way on a device).
  std::mutex mu_;
  std::condition_variable cv_;
  BackendBuffer published_;
  int64_t published_version_ = 0;
  bool stopping_ = false;
  bool paused_ = false;        // buffer_contents(): no new batch starts
  bool generating_ = false;    // a batch is between its weights and the buffer
  int64_t first_rollout_ = 0;  // the rollout thread's first target step
  // Partial rollouts: the groups cut in the last batch, continued by the next (the rollout
  // thread's; read by buffer_contents() only while it is paused between batches).
  std::vector<PromptGroup> carry_;
  // Rollout thread accounting (under mu_).
  double rollout_busy_ = 0, rollout_wait_ = 0;
  int64_t generated_tokens_ = 0;
  double last_rollout_busy_ = 0, last_rollout_wait_ = 0, last_learner_end_ = 0;
  int64_t last_generated_ = 0;
  ReplayStats last_buffer_;
  // The learner's offer (learner_share): none, offered, taken by the rollout thread, done.
  enum class Help { None, Offered, Taken, Done } help_ = Help::None;
  int64_t help_version_ = 0;
  double help_latest_ = 0;  // the latest start the learner's offer allows
  double help_seconds_ = 0, help_busy_ = 0, last_help_busy_ = 0;
  ModelInput help_input_;  // the offer's input (its arrays are the learner's, until collect())

  std::thread thread_;
};

}  // namespace loom::rl
