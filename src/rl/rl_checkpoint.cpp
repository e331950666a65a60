#include "rl/rl_checkpoint.h"

#include <algorithm>
#include <cstring>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "rl/trajectory_wire.h"
#include "train/host_staging.h"

namespace loom::rl {

std::map<std::string, Tensor> whole_state_tensors(Optimizer& optim, const ParamSet& P) {
  std::map<std::string, Tensor> out;
  for (const StateSlice& s : optim.state_slices()) {
    const std::string param = s.name.substr(s.name.find('.') + 1);  // "exp_avg.<param>"
    const ParamInfo& p = P.info(param);
    LOOM_CHECK(s.offset == 0 && s.tensor.numel() == p.numel, s.name, ": the optimizer holds ",
               s.tensor.numel(), " of its ", p.numel, " elements from ", s.offset,
               " (a sharded state has no whole tensors)");
    out[s.name] = Tensor::view_of(s.tensor.data<float>(), p.shape, DType::F32);
  }
  return out;
}

std::string encode_replay_buffer(const std::vector<BufferedStep>& buffer) {
  static const char* digits = "0123456789abcdef";
  std::vector<uint8_t> bytes;
  for (const BufferedStep& b : buffer) {
    RolloutBatch rb;
    rb.groups = b.groups;
    rb.dropped_timeout = b.dropped;  // the buffer keeps one count per step
    rb.dropped_env = b.complete;     // and the mark that the step's batch is all there
    const std::vector<uint8_t> msg = encode_trajectories(rb, b.target_step);
    const uint64_t n = msg.size();
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&n);
    bytes.insert(bytes.end(), p, p + 8);
    bytes.insert(bytes.end(), msg.begin(), msg.end());
  }
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (uint8_t x : bytes) {
    hex.push_back(digits[x >> 4]);
    hex.push_back(digits[x & 15]);
  }
  return hex;
}

std::vector<BufferedStep> decode_replay_buffer(const std::string& hex, const std::string& where) {
  LOOM_CHECK(hex.size() % 2 == 0, where, ": rl_replay_buffer has an odd number (", hex.size(),
             ") of hex digits");
  std::vector<uint8_t> bytes(hex.size() / 2);
  auto nibble = [&](size_t i) {
    const char c = hex[i];
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail(where, ": rl_replay_buffer has '", c, "' at character ", i, ", not a hex digit");
  };
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = uint8_t(nibble(2 * i) << 4 | nibble(2 * i + 1));
  std::vector<BufferedStep> out;
  for (size_t pos = 0; pos < bytes.size();) {
    LOOM_CHECK(bytes.size() - pos >= 8, where, ": rl_replay_buffer is truncated at byte ", pos);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data() + pos, 8);
    pos += 8;
    LOOM_CHECK(n <= bytes.size() - pos, where, ": rl_replay_buffer: a message of ", n,
               " bytes at byte ", pos - 8, " exceeds the ", bytes.size() - pos, " bytes left");
    const std::vector<uint8_t> msg(bytes.begin() + int64_t(pos), bytes.begin() + int64_t(pos + n));
    int64_t step = 0;
    RolloutBatch rb =
        decode_trajectories(msg, cat(where, " (rl_replay_buffer, byte ", pos, ")"), &step);
    LOOM_CHECK(out.empty() || step > out.back().target_step, where,
               ": rl_replay_buffer lists step ", step, " after step ", out.back().target_step);
    BufferedStep b;
    b.target_step = step;
    b.groups = std::move(rb.groups);
    b.dropped = rb.dropped_timeout;
    LOOM_CHECK(rb.dropped_env <= 1, where, ": rl_replay_buffer: step ", step,
               " has a completion mark of ", rb.dropped_env);
    b.complete = rb.dropped_env == 1;
    out.push_back(std::move(b));
    pos += n;
  }
  return out;
}

int64_t check_resume_buffer(const std::vector<BufferedStep>& buffer, int64_t step,
                            int64_t prompts) {
  int64_t first = step;
  for (const BufferedStep& b : buffer) {
    LOOM_CHECK(b.complete || int64_t(b.groups.size()) + b.dropped == prompts,
               "the checkpoint's replay buffer holds ", b.groups.size(), " groups and ", b.dropped,
               " dropped for step ", b.target_step, ", not the ", prompts,
               " prompts of a step (--prompts changed?)");
    first = std::max(first, b.target_step + 1);
  }
  for (int64_t s = step; s < first; ++s) {
    const bool covered = std::any_of(buffer.begin(), buffer.end(),
                                     [&](const BufferedStep& b) { return b.target_step == s; });
    LOOM_CHECK(covered, "the checkpoint's replay buffer skips step ", s, " (resuming at step ",
               step, ")");
  }
  return first;
}

void check_resume_carry(const std::vector<PromptGroup>& carried, int64_t first,
                        int partial_tokens) {
  if (carried.empty()) return;
  LOOM_CHECK(partial_tokens > 0, "the checkpoint holds ", carried.size(),
             " unfinished groups of partial rollouts: resume with --partial-tokens (and --async "
             "or --rollout-ranks)");
  for (const PromptGroup& g : carried)
    LOOM_CHECK(g.target_step == first, "the checkpoint's unfinished group of task ", g.task_index,
               " continues at step ", g.target_step, ", but the rollouts resume at step ", first);
}

std::string save_rl_checkpoint(const std::string& root, int64_t step, const RlCheckpointInfo& info,
                               Decoder& policy, Optimizer& optim,
                               const std::vector<BufferedStep>& buffer,
                               const std::vector<PromptGroup>& carried) {
  ckpt::TrainerState st;
  st.step = step;
  st.config_text = info.config_text;
  st.extra["model_fingerprint"] = info.fingerprint;
  st.extra["precision"] = info.precision;
  if (!info.loss_scaler.is_null()) st.extra["rl_loss_scaler"] = info.loss_scaler;
  st.extra["rl"] = info.description;
  st.extra["rl_adam_steps"] = optim.steps_taken();
  st.extra["rl_weight_version"] = step;
  st.extra["rl_max_staleness"] = info.max_staleness;
  int64_t groups = 0;
  for (const BufferedStep& b : buffer) groups += int64_t(b.groups.size());
  st.extra["rl_replay_buffer_groups"] = groups;
  st.extra["rl_replay_buffer"] = encode_replay_buffer(buffer);
  if (!carried.empty()) {
    // One trajectory message of the step they continue at (every group targets it).
    BufferedStep c;
    c.target_step = carried.front().target_step;
    c.groups = carried;
    st.extra["rl_partial_groups_count"] = int64_t(carried.size());
    st.extra["rl_partial_groups"] = encode_replay_buffer({c});
  }
  // The optimizer's state through host copies when it is device memory (views on the CPU).
  HostStaging staging(policy.backend());
  const ckpt::TensorList state =
      staging.stage(ckpt::to_list(whole_state_tensors(optim, policy.params())));
  return ckpt::save_checkpoint(root, st, ckpt::to_list(policy.params().host_values()), state);
}

RlResumePoint open_rl_checkpoint(const std::string& dir, const std::string& fingerprint) {
  auto c = std::make_shared<ckpt::Checkpoint>(dir);
  const Json& extra = c->state().extra;
  LOOM_CHECK(extra.contains("rl_adam_steps"), c->dir(),
             ": not a loom rl checkpoint (no rl_adam_steps in state.json)");
  RlResumePoint r;
  r.dir = c->dir();
  r.step = c->state().step;
  LOOM_CHECK(r.step >= 0, c->dir(), ": negative step ", r.step);
  // Checkpoints written before the buffer was saved have none: their resume regenerates.
  if (extra.contains("rl_replay_buffer"))
    r.buffer = decode_replay_buffer(extra.at("rl_replay_buffer").as_string(), c->dir());
  if (extra.contains("rl_partial_groups")) {
    const std::string where = c->dir() + " (rl_partial_groups)";
    std::vector<BufferedStep> p =
        decode_replay_buffer(extra.at("rl_partial_groups").as_string(), where);
    LOOM_CHECK(p.size() == 1, where, ": ", p.size(), " steps, not one");
    for (const PromptGroup& g : p[0].groups) {
      const bool open = std::any_of(g.rollouts.begin(), g.rollouts.end(),
                                    [](const Rollout& ro) { return !ro.finished; });
      LOOM_CHECK(
          open && g.version <= r.step, where, ": the group of task ", g.task_index,
          open ? cat(" has tokens of weight version ", g.version, ", newer than step ", r.step)
               : std::string(" has no unfinished completion"));
    }
    r.carried = std::move(p[0].groups);
  }
  const int64_t adam_steps = extra.at("rl_adam_steps").as_int(0, INT64_MAX);
  // state.json's own fingerprint is the tensor shapes' (restore_model checks the shapes); the
  // model config's is in extra, as the checkpoint was saved.
  LOOM_CHECK(!extra.contains("model_fingerprint") ||
                 extra.at("model_fingerprint").as_string() == fingerprint,
             c->dir(), ": a checkpoint of the model '", extra.at("model_fingerprint").as_string(),
             "', not of '", fingerprint, "' (--ckpt)");
  r.restore = [c, adam_steps](Decoder& policy, Optimizer& optim, LossScaler* scaler) {
    const Json& extra = c->state().extra;
    // fp16: the scale and its history continue (a checkpoint without them: the initial scale).
    if (scaler && extra.contains("rl_loss_scaler")) scaler->restore(extra.at("rl_loss_scaler"));
    auto staged = policy.params().host_values();  // host staging of the weights
    c->restore_model(staged);
    policy.params().store_values(staged);
    HostStaging staging(policy.backend());
    c->restore_optim(staging.stage(ckpt::to_list(whole_state_tensors(optim, policy.params()))));
    staging.upload();
    optim.set_steps_taken(adam_steps);
    return c->state().step;
  };
  return r;
}

}  // namespace loom::rl
