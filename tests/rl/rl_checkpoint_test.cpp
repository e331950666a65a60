// RL checkpoints with the replay buffer: an asynchronous run (max staleness 1) stopped after 3
// steps and resumed from its checkpoint trains on the groups it had generated ahead (from the
// older weights) and ends with the same weights, bit for bit, as the uninterrupted run; the
// buffer's encoding rejects corrupt bytes with the checkpoint and the byte named.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "rl/async_grpo.h"
#include "rl/rl_checkpoint.h"
#include "rl_test_util.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::rl;

namespace {

// Max staleness 1 with a fixed lag: before the learner steps at s, the rollouts of s + 1 are
// in the buffer. They come from version s (the learner has not published s + 1 yet, and the
// bound forbids older), so every run generates each step from the same weights, whatever the
// timing: the uninterrupted and the resumed run are comparable bit for bit.
AsyncOptions lagged(AsyncGrpo** self, int64_t prompts) {
  AsyncOptions ao;
  ao.max_staleness = 1;
  ao.threads_per_role = 1;
  ao.learner_timeout = 60;
  ao.before_learn = [self, prompts](int64_t s) {
    const double t0 = now_seconds();
    while ((*self)->buffered_groups() < prompts) {
      if (now_seconds() - t0 > 30)
        fail("step ", s, ": the rollouts of step ", s + 1, " never came");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  return ao;
}

void expect_same_step(const RlStepStats& x, const RlStepStats& y) {
  EXPECT_EQ(x.reward_mean, y.reward_mean) << "step " << x.step;
  EXPECT_EQ(x.loss, y.loss) << "step " << x.step;
  EXPECT_EQ(x.grad_norm, y.grad_norm) << "step " << x.step;
  EXPECT_EQ(x.entropy, y.entropy) << "step " << x.step;
  EXPECT_EQ(x.staleness, y.staleness) << "step " << x.step;
}

}  // namespace

TEST(RlCheckpoint, AsyncResumeTrainsOnTheBufferedGroups) {
  set_num_threads(1);
  const RlOptions o = rltest::small_options();
  const int64_t steps = 6, cut = 3;
  // The uninterrupted run.
  rltest::Fixture a;
  AsyncGrpo* pa = nullptr;
  std::vector<RlStepStats> full;
  {
    AsyncGrpo t(a.model, a.tok, a.chat, a.env, o, lagged(&pa, o.prompts_per_step));
    pa = &t;
    for (int64_t s = 0; s < steps; ++s) full.push_back(t.step());
  }
  // The same run stopped after `cut` steps with a checkpoint...
  test::TempDir dir("rl_ckpt");
  const std::string fp = a.model.config().fingerprint();
  RlCheckpointInfo info;
  info.fingerprint = fp;
  info.description = "test";
  info.max_staleness = 1;
  std::string saved;
  int64_t buffered = 0;
  {
    rltest::Fixture b;
    AsyncGrpo* pb = nullptr;
    AsyncGrpo t(b.model, b.tok, b.chat, b.env, o, lagged(&pb, o.prompts_per_step));
    pb = &t;
    for (int64_t s = 0; s < cut; ++s) expect_same_step(full[size_t(s)], t.step());
    const std::vector<BufferedStep> buf = t.buffer_contents();
    for (const BufferedStep& x : buf) buffered += int64_t(x.groups.size());
    saved =
        save_rl_checkpoint(dir / "checkpoints", cut, info, b.model, t.learner().optimizer(), buf);
  }
  // The rollouts of step `cut` were made before the checkpoint, from version cut - 1 (those of
  // cut + 1, from version cut, may be there too, depending on timing: the same either way).
  EXPECT_GE(buffered, o.prompts_per_step) << "the checkpoint holds no buffered step";
  // ... and resumed from it in a new process's state (a fresh model and optimizer).
  rltest::Fixture c;
  RlResumePoint rp = open_rl_checkpoint(saved, fp);
  EXPECT_EQ(rp.step, cut);
  ASSERT_GE(rp.buffer.size(), 1u);
  EXPECT_EQ(rp.buffer[0].target_step, cut);
  for (const PromptGroup& g : rp.buffer[0].groups) EXPECT_EQ(g.version, cut - 1);
  AsyncGrpo* pc = nullptr;
  AsyncOptions ao = lagged(&pc, o.prompts_per_step);
  ao.resume_buffer = rp.buffer;
  AsyncGrpo t(c.model, c.tok, c.chat, c.env, o, ao, rp.restore);
  pc = &t;
  EXPECT_EQ(t.steps_taken(), cut);
  for (int64_t s = cut; s < steps; ++s) {
    const RlStepStats st = t.step();
    if (s == cut) {
      // Trained on the checkpoint's groups, one step old (regenerated ones would be on policy).
      ASSERT_EQ(st.staleness.size(), 2u);
      EXPECT_EQ(st.staleness[1], o.prompts_per_step);
    }
    expect_same_step(full[size_t(s)], st);
  }
  t.stop();
  const ParamSet &pa_w = a.model.params(), &pc_w = c.model.params();
  EXPECT_EQ(std::memcmp(pa_w.data(), pc_w.data(), size_t(pa_w.total()) * sizeof(float)), 0)
      << "the resumed run's weights differ from the uninterrupted run's";
  EXPECT_EQ(t.buffer_stats().dropped_stale, 0);
}

// Partial rollouts (5-token completions in slices of 3: two batches, so at max staleness 1 new
// groups start 0 steps ahead and batch s always comes from version s, whatever the timing): a
// checkpoint after `cut` steps holds the groups whose completions were cut and not finished
// (their tokens so far, each with its version); a run resumed from it continues them in its
// first batch and takes the uninterrupted run's steps, ending with its weights bit for bit.
// Resumed without them, the steps where they would have finished train on fewer groups.
TEST(RlCheckpoint, PartialRolloutsResumeTheirCutGroups) {
  set_num_threads(1);
  RlOptions o = rltest::small_options();
  o.partial_tokens = 3;
  const int64_t steps = 6, cut = 3;
  AsyncOptions ao;
  ao.max_staleness = 1;
  ao.threads_per_role = 1;
  ao.learner_timeout = 60;
  rltest::Fixture a;
  std::vector<RlStepStats> full;
  {
    AsyncGrpo t(a.model, a.tok, a.chat, a.env, o, ao);
    for (int64_t s = 0; s < steps; ++s) full.push_back(t.step());
  }
  test::TempDir dir("rl_ckpt_partial");
  const std::string fp = a.model.config().fingerprint();
  RlCheckpointInfo info;
  info.fingerprint = fp;
  info.description = "test";
  info.max_staleness = 1;
  std::string saved;
  std::vector<PromptGroup> cut_groups;
  {
    rltest::Fixture b;
    AsyncGrpo t(b.model, b.tok, b.chat, b.env, o, ao);
    for (int64_t s = 0; s < cut; ++s) expect_same_step(full[size_t(s)], t.step());
    const std::vector<BufferedStep> buf = t.buffer_contents(&cut_groups);
    saved = save_rl_checkpoint(dir / "checkpoints", cut, info, b.model, t.learner().optimizer(),
                               buf, cut_groups);
  }
  ASSERT_FALSE(cut_groups.empty()) << "no completion was cut: the test proves nothing";
  RlResumePoint rp = open_rl_checkpoint(saved, fp);
  ASSERT_EQ(rp.carried.size(), cut_groups.size());
  int64_t open = 0;
  for (size_t i = 0; i < rp.carried.size(); ++i) {
    const PromptGroup &x = cut_groups[i], &y = rp.carried[i];
    EXPECT_EQ(x.task_index, y.task_index);
    EXPECT_EQ(x.version, y.version);
    for (size_t k = 0; k < x.rollouts.size(); ++k) {
      EXPECT_EQ(x.rollouts[k].response, y.rollouts[k].response);
      EXPECT_EQ(x.rollouts[k].logprobs, y.rollouts[k].logprobs);
      EXPECT_EQ(x.rollouts[k].versions, y.rollouts[k].versions);
      EXPECT_EQ(x.rollouts[k].finished, y.rollouts[k].finished);
      EXPECT_EQ(x.rollouts[k].stopped, y.rollouts[k].stopped);
      open += !y.rollouts[k].finished;
    }
  }
  EXPECT_GT(open, 0) << "the saved groups hold no unfinished completion";
  auto resume = [&](bool with_carry, rltest::Fixture& c) {
    AsyncOptions ar = ao;
    ar.resume_buffer = rp.buffer;
    if (with_carry) ar.resume_carry = rp.carried;
    AsyncGrpo t(c.model, c.tok, c.chat, c.env, o, ar, rp.restore);
    std::vector<RlStepStats> out;
    for (int64_t s = cut; s < steps; ++s) out.push_back(t.step());
    EXPECT_EQ(t.buffer_stats().dropped_stale, 0);
    return out;
  };
  rltest::Fixture c;
  const std::vector<RlStepStats> resumed = resume(true, c);
  for (int64_t s = cut; s < steps; ++s) {
    expect_same_step(full[size_t(s)], resumed[size_t(s - cut)]);
    EXPECT_EQ(full[size_t(s)].groups, resumed[size_t(s - cut)].groups) << "step " << s;
    EXPECT_EQ(full[size_t(s)].spanning_rollouts, resumed[size_t(s - cut)].spanning_rollouts);
  }
  const ParamSet &pa_w = a.model.params(), &pc_w = c.model.params();
  EXPECT_EQ(std::memcmp(pa_w.data(), pc_w.data(), size_t(pa_w.total()) * sizeof(float)), 0)
      << "the resumed run's weights differ from the uninterrupted run's";
  // Without the cut groups (what a resume did before they were saved): their prompts are lost.
  rltest::Fixture d;
  const std::vector<RlStepStats> lost = resume(false, d);
  int64_t full_groups = 0, lost_groups = 0;
  for (int64_t s = cut; s < steps; ++s) {
    full_groups += full[size_t(s)].groups;
    lost_groups += lost[size_t(s - cut)].groups;
  }
  EXPECT_LT(lost_groups, full_groups) << "resumed without the cut groups, nothing was lost";
  std::printf(
      "partial rollouts: %zu cut groups saved; resumed without them, steps %lld..%lld "
      "train on %lld groups instead of %lld\n",
      cut_groups.size(), static_cast<long long>(cut), static_cast<long long>(steps - 1),
      static_cast<long long>(lost_groups), static_cast<long long>(full_groups));
}

TEST(RlCheckpoint, CorruptBufferIsAnErrorNamingTheByte) {
  PromptGroup g;
  g.target_step = 4;
  g.version = 3;
  g.task_index = 12;
  g.prompt = {1, 2, 3};
  g.rollouts.resize(2);
  g.rollouts[0].response = {5, 6};
  g.rollouts[0].logprobs = {-0.5f, -1.25f};
  g.rollouts[0].versions = {3, 4};  // a partial rollout continued on version 4
  g.rollouts[0].text = "ab";
  g.rollouts[0].reward = 0.5;
  BufferedStep b;
  b.target_step = 4;
  b.groups = {g};
  b.dropped = 1;
  const std::string hex = encode_replay_buffer({b});
  const std::vector<BufferedStep> back = decode_replay_buffer(hex, "ckpt");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].dropped, 1);
  ASSERT_EQ(back[0].groups.size(), 1u);
  EXPECT_EQ(back[0].groups[0].version, 3);
  EXPECT_EQ(back[0].groups[0].rollouts[0].logprobs, g.rollouts[0].logprobs);
  EXPECT_EQ(back[0].groups[0].rollouts[0].text, "ab");
  EXPECT_EQ(back[0].groups[0].rollouts[0].versions, g.rollouts[0].versions);
  auto expect_error = [](const std::string& h, const std::string& what) {
    try {
      decode_replay_buffer(h, "runs/x/step_00000004");
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("runs/x/step_00000004"), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  expect_error(hex.substr(0, hex.size() - 1), "odd number");
  expect_error("zz" + hex.substr(2), "'z' at character 0");
  expect_error(hex.substr(0, hex.size() - 10), "exceeds the");  // the message cut short
  std::string bad = hex;
  bad[16] = bad[16] == '0' ? '1' : '0';  // the message's magic number
  expect_error(bad, "bad magic");
  // A buffered group made by weights newer than the learner it is restored into.
  ReplayBuffer rb(1);
  try {
    rb.restore({b}, 2);
    ADD_FAILURE() << "restored step 4 into a learner at step 2 that never made version 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight version 3"), std::string::npos) << e.what();
  }
  // With a tighter bound than the saving run's, the old groups are dropped and counted.
  ReplayBuffer tight(0);
  tight.restore({b}, 4);
  EXPECT_EQ(tight.size(), 0);
  EXPECT_EQ(tight.stats().dropped_stale, 1);
}
