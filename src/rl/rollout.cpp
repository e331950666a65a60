#include "rl/rollout.h"

#include "core/error.h"
#include "core/log.h"
#include "rl/grpo_trainer.h"

namespace loom::rl {

RolloutWorker::RolloutWorker(Decoder& model, const data::BpeTokenizer& tok,
                             const data::ChatTemplate& chat, const Environment& env,
                             const RlOptions& opt)
    : tok_(tok), chat_(chat), env_(env), opt_(opt) {
  runner_ = std::make_unique<infer::DecoderRunner>(model);
  infer::EngineConfig ec;
  ec.eos_ids = {chat.end_of_turn()};
  if (tok.eot_id() >= 0) ec.eos_ids.push_back(tok.eot_id());
  ec.detokenize = [this](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids)
      if (t < tok_.vocab_size()) tok_.decode_append(t, s);
    return s;
  };
  ec.seed = opt.seed;
  engine_ = std::make_unique<infer::LoomEngine>(*runner_, ec);
}

RolloutWorker::~RolloutWorker() = default;

RolloutBatch RolloutWorker::generate(int64_t target_step, int64_t version, int part, int parts) {
  LOOM_CHECK(parts >= 1 && part >= 0 && part < parts, "rollout share ", part, " of ", parts);
  RolloutBatch out;
  const int P = opt_.prompts_per_step, G = opt_.group_size;
  const double t0 = now_seconds();
  std::vector<PromptGroup> groups(static_cast<size_t>(P));
  std::vector<int64_t> ids(static_cast<size_t>(P));
  std::vector<int> open(static_cast<size_t>(P), G);  // completions not yet finished
  std::vector<bool> aborted(static_cast<size_t>(P), false);
  for (int i = 0; i < P; ++i) {
    if (i % parts != part) {  // another rank's prompt
      open[size_t(i)] = 0;
      continue;
    }
    PromptGroup& g = groups[size_t(i)];
    g.target_step = target_step;
    g.version = version;
    g.task_index = uint64_t(target_step) * uint64_t(P) + uint64_t(i);
    g.task = env_.task(opt_.seed, g.task_index);
    g.prompt = chat_.prompt_ids({{"user", g.task.prompt}});
    g.rollouts.resize(size_t(G));
    infer::SamplingParams sp;
    sp.temperature = opt_.temperature;
    sp.max_tokens = opt_.max_tokens;
    sp.n = G;
    sp.seed = opt_.seed * 1000003 + g.task_index;
    sp.logprobs = 0;  // the sampled token's log-prob under the raw logits (temperature 1)
    ids[size_t(i)] = engine_->submit(g.prompt, sp, [&, i](const infer::TokenEvent& e) {
      Rollout& r = groups[size_t(i)].rollouts[size_t(e.index)];
      r.response.insert(r.response.end(), e.tokens.begin(), e.tokens.end());
      r.logprobs.insert(r.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
      r.text += e.text;
      out.generated_tokens += int64_t(e.tokens.size());
      if (e.finished) {
        if (e.stop_token >= 0) r.response.push_back(e.stop_token);
        if (e.finish_reason == "abort") aborted[size_t(i)] = true;
        --open[size_t(i)];
      }
    });
  }
  // Step the engine ourselves so that the deadline is checked between steps.
  const double deadline = opt_.rollout_timeout > 0 ? t0 + opt_.rollout_timeout : 0;
  while (engine_->step()) {
    if (deadline > 0 && now_seconds() > deadline) {
      for (int i = 0; i < P; ++i)
        if (i % parts == part && open[size_t(i)] > 0) engine_->cancel(ids[size_t(i)]);
      break;
    }
  }
  engine_->run_until_idle();  // delivers the cancellations (and anything a step left)
  for (int i = 0; i < P; ++i) {
    if (i % parts != part) continue;
    PromptGroup& g = groups[size_t(i)];
    if (aborted[size_t(i)] || open[size_t(i)] > 0) {
      ++out.dropped_timeout;
      continue;
    }
    bool scored = true;
    for (Rollout& r : g.rollouts) {
      LOOM_CHECK(r.logprobs.size() == r.response.size(), "rollout of task ", g.task_index, ": ",
                 r.logprobs.size(), " log-probs for ", r.response.size(), " tokens");
      try {
        r.reward = env_.reward(g.task, r.text);
      } catch (const std::exception& e) {
        log_warn("environment ", env_.name(), " could not score task ", g.task_index,
                 " (group dropped): ", e.what());
        scored = false;
        break;
      }
    }
    if (!scored) {
      ++out.dropped_env;
      continue;
    }
    out.groups.push_back(std::move(g));
  }
  out.seconds = now_seconds() - t0;
  return out;
}

}  // namespace loom::rl
