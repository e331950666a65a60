#include "rl/async_grpo.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "rl/rl_checkpoint.h"

namespace loom::rl {

AsyncGrpo::AsyncGrpo(Decoder& policy, const data::BpeTokenizer& tok, const data::ChatTemplate& chat,
                     const Environment& env, const RlOptions& opt, const AsyncOptions& async,
                     const RlRestore& restore)
    : opt_(opt),
      async_(async),
      policy_(policy),
      learner_(policy, opt_),
      buffer_(async.max_staleness),
      step_(restore_learner(restore, policy, learner_)) {
  LOOM_CHECK(async.learner_timeout > 0, "rl.learner_timeout must be positive");
  // Partial rollouts: new groups start fewer steps ahead, so that every group finishes within
  // the bound (rollout_lead).
  lead_ = rollout_lead(opt, async.max_staleness);
  threads_ =
      async.threads_per_role > 0 ? async.threads_per_role : std::max(1, omp_get_num_procs() / 2);
  // In the policy's compute type on its backend: the rollouts sample from the weights the
  // learner computes with (the policy's copy, already rounded from the master).
  snapshot_ = std::make_unique<Decoder>(policy.config(), policy.backend(), Recompute::None,
                                        policy.act_dtype());
  const ParamSet& P = policy.params();
  published_ = BackendBuffer(policy.backend(), sizeof(float) * size_t(P.total()),
                             "rl published weights");
  P.copy_values_to(published_.as<float>(), 0, P.total());
  published_version_ = step_;
  snapshot_->params().copy_values_from(P);
  rollout_ = std::make_unique<RolloutWorker>(*snapshot_, tok, chat, env, opt_);
  if (opt_.learner_share > 0) learner_.set_helper(this);
  // A resume's buffered groups: the learner takes them as the uninterrupted run would have, and
  // the rollouts go on after the last step they cover.
  first_rollout_ = check_resume_buffer(async_.resume_buffer, step_, opt_.prompts_per_step);
  check_resume_carry(async_.resume_carry, first_rollout_, opt_.partial_tokens);
  buffer_.restore(std::move(async_.resume_buffer), step_);
  async_.resume_buffer.clear();
  carry_ = std::move(async_.resume_carry);
  async_.resume_carry.clear();
  last_learner_end_ = now_seconds();
  // The snapshot's version is passed by value: the learner may step (on restored groups) before
  // the thread first runs, so step_ is no longer the snapshot's version by then.
  thread_ = std::thread([this, version = step_] { rollout_loop(version); });
}

AsyncGrpo::~AsyncGrpo() {
  stop();
}

void AsyncGrpo::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AsyncGrpo::rollout_loop(int64_t have) {
  // Per-thread OpenMP setting: this thread's kernels (and OpenBLAS, which follows the calling
  // thread's OpenMP setting) use threads_ cores, the learner's the others.
  omp_set_num_threads(threads_);
  try {
    for (int64_t s = first_rollout_;; ++s) {
      const double w0 = now_seconds();
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Generation for step s may start from version s - max_staleness at the oldest; while
        // it waits, the thread runs the learner's offered shares (learner_share).
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(async_.learner_timeout));
        double helped = 0;
        for (;;) {
          const bool ok = cv_.wait_until(lock, deadline, [&] {
            return stopping_ || help_ == Help::Offered ||
                   (!paused_ && s - published_version_ <= lead_);
          });
          if (stopping_) return;
          if (help_ == Help::Offered) {
            const double h0 = now_seconds();
            help(lock, &have);
            helped += now_seconds() - h0;
            continue;
          }
          LOOM_CHECK(ok, "the rollout side waited ", async_.learner_timeout,
                     " s (rl.learner_timeout) for weight version ", s - lead_,
                     " but the learner published only ", published_version_);
          break;
        }
        if (published_version_ > have) {
          snapshot_->params().write_values_on_backend(published_.as<float>());
          have = published_version_;
          rollout_->weights_updated();
        }
        rollout_wait_ += now_seconds() - w0 - helped;
        generating_ = true;
      }
      if (async_.before_rollout) async_.before_rollout(s);
      const double b0 = now_seconds();
      // Partial rollouts: groups already past the bound at step s are not worth continuing;
      // they go to the buffer with the batch, which drops and counts them as stale.
      std::vector<PromptGroup> too_old;
      if (!carry_.empty()) {
        std::vector<PromptGroup> keep;
        for (PromptGroup& g : carry_) {
          g.target_step = s;
          (s - g.version > async_.max_staleness ? too_old : keep).push_back(std::move(g));
        }
        carry_.swap(keep);
      }
      RolloutBatch rb =
          rollout_->generate(s, have, 0, 1, opt_.partial_tokens > 0 ? &carry_ : nullptr);
      for (PromptGroup& g : too_old) rb.groups.push_back(std::move(g));
      buffer_.push_step(s, std::move(rb.groups), rb.dropped_timeout, rb.dropped_env);
      {
        std::lock_guard<std::mutex> lock(mu_);
        rollout_busy_ += now_seconds() - b0;
        generated_tokens_ += rb.generated_tokens;
        generating_ = false;
      }
      cv_.notify_all();  // a checkpoint may be waiting for this batch
    }
  } catch (const std::exception& e) {
    log_warn("rollout thread stopped: ", e.what());
    buffer_.fail(e.what());
    {
      std::lock_guard<std::mutex> lock(mu_);
      generating_ = false;
    }
    cv_.notify_all();
  }
}

void AsyncGrpo::help(std::unique_lock<std::mutex>& lock, int64_t* have) {
  // Declined (the learner computes the share itself) when it is too late to finish before the
  // learner's own part.
  if (now_seconds() > help_latest_) {
    help_ = Help::None;
    cv_.notify_all();
    return;
  }
  // The learner offers a share with the weights it holds, which it published after its last
  // step: the newest version.
  if (published_version_ > *have) {
    snapshot_->params().write_values_on_backend(published_.as<float>());
    *have = published_version_;
    rollout_->weights_updated();
  }
  LOOM_CHECK(*have == help_version_, "the learner offered a share with weight version ",
             help_version_, " but the newest published is ", *have);
  help_ = Help::Taken;
  const ModelInput in = help_input_;
  lock.unlock();
  const double t0 = now_seconds();
  try {
    snapshot_->params().zero_grad();
    snapshot_->forward_backward(in, 1.f);
  } catch (...) {
    lock.lock();
    help_ = Help::None;  // the learner computes it itself (and meets the same error)
    cv_.notify_all();
    throw;
  }
  const double dt = now_seconds() - t0;
  lock.lock();
  help_seconds_ = dt;
  help_busy_ += dt;
  help_ = Help::Done;
  cv_.notify_all();
}

void AsyncGrpo::offer(const ModelInput& in, int64_t version, double latest_start) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    help_input_ = in;
    help_version_ = version;
    help_latest_ = async_.help_any_time ? std::numeric_limits<double>::infinity() : latest_start;
    help_ = Help::Offered;
  }
  cv_.notify_all();
  if (async_.after_offer) async_.after_offer(version);
}

const float* AsyncGrpo::collect(double* seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (help_ != Help::Taken && help_ != Help::Done) {  // not taken (yet): withdrawn
    help_ = Help::None;
    return nullptr;
  }
  const bool done = cv_.wait_for(lock, std::chrono::duration<double>(async_.learner_timeout),
                                 [&] { return help_ != Help::Taken; });
  LOOM_CHECK(done, "learner step ", step_, ": the rollout thread took a share of the step's ",
             "forward and backward and did not finish it within ", async_.learner_timeout,
             " s (rl.learner_timeout)");
  if (help_ != Help::Done) return nullptr;  // it failed: the learner computes the share
  help_ = Help::None;
  *seconds = help_seconds_;
  return snapshot_->params().grad();
}

std::vector<BufferedStep> AsyncGrpo::buffer_contents(std::vector<PromptGroup>* carried) {
  std::unique_lock<std::mutex> lock(mu_);
  paused_ = true;
  const bool idle = cv_.wait_for(lock, std::chrono::duration<double>(async_.learner_timeout),
                                 [&] { return !generating_; });
  // The buffer's copy is taken with no batch in flight: every group generated so far is in it.
  std::vector<BufferedStep> out;
  if (idle) {
    out = buffer_.contents();
    if (carried) *carried = carry_;  // cut by the last batch the buffer holds
  }
  paused_ = false;
  lock.unlock();
  cv_.notify_all();
  LOOM_CHECK(idle, "checkpoint after step ", step_, ": the rollout batch in flight did not reach ",
             "the replay buffer within ", async_.learner_timeout, " s (rl.learner_timeout)");
  return out;
}

RlStepStats AsyncGrpo::step() {
  omp_set_num_threads(threads_);
  RlStepStats st;
  st.step = step_;
  const double t0 = now_seconds();
  std::vector<PromptGroup> groups =
      buffer_.take(step_, opt_.prompts_per_step, async_.learner_timeout);
  st.learner_wait_seconds = now_seconds() - t0;
  if (async_.before_learn) async_.before_learn(step_);
  learner_.learn(groups, step_, &st);
  ++step_;
  const double t1 = now_seconds();
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ParamSet& P = policy_.params();
    P.copy_values_to(published_.as<float>(), 0, P.total());
    published_version_ = step_;
    // This step's share of the rollout side's time, since the previous step ended.
    const double busy = rollout_busy_ - last_rollout_busy_;
    const double helping = help_busy_ - last_help_busy_;  // the learner's share, on this side
    st.rollout_seconds = busy;
    st.rollout_utilisation = (busy + helping) / std::max(t1 - last_learner_end_, 1e-9);
    st.generation_tokens_per_s = double(generated_tokens_ - last_generated_) / std::max(busy, 1e-9);
    last_rollout_busy_ = rollout_busy_;
    last_help_busy_ = help_busy_;
    last_rollout_wait_ = rollout_wait_;
    last_generated_ = generated_tokens_;
  }
  cv_.notify_all();
  st.learner_utilisation =
      (t1 - t0 - st.learner_wait_seconds) / std::max(t1 - last_learner_end_, 1e-9);
  last_learner_end_ = t1;
  const ReplayStats b = buffer_.stats();
  st.dropped_timeout = b.dropped_timeout - last_buffer_.dropped_timeout;
  st.dropped_env = b.dropped_env - last_buffer_.dropped_env;
  st.dropped_stale = b.dropped_stale - last_buffer_.dropped_stale;
  last_buffer_ = b;
  return st;
}

}  // namespace loom::rl
