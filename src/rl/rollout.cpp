#include "rl/rollout.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "rl/grpo_trainer.h"

namespace loom::rl {

int64_t rollout_lead(const RlOptions& opt, int64_t max_staleness) {
  if (opt.partial_tokens <= 0) return max_staleness;
  const int64_t batches = (opt.max_tokens + opt.partial_tokens - 1) / opt.partial_tokens;
  const int64_t lead = max_staleness - (batches - 1);
  LOOM_CHECK(batches >= 2 && lead >= 0, "partial rollouts of ", opt.partial_tokens,
             " tokens per batch take up to ", batches, " batches (steps) for ", opt.max_tokens,
             " tokens; they need max_staleness >= ", batches - 1, " (got ", max_staleness,
             ") and fewer tokens per batch than max_tokens");
  return lead;
}

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

namespace {

// Deterministic seed of a continuation: distinct per task, completion and tokens done so far.
uint64_t continuation_seed(uint64_t seed, uint64_t task, size_t g, size_t done) {
  uint64_t z = seed * 1000003 + task + 0x9e3779b97f4a7c15ull * (uint64_t(g) + 1) +
               0xbf58476d1ce4e5b9ull * (uint64_t(done) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

RolloutBatch RolloutWorker::generate(int64_t target_step, int64_t version, int part, int parts,
                                     std::vector<PromptGroup>* carry) {
  LOOM_CHECK(parts >= 1 && part >= 0 && part < parts, "rollout share ", part, " of ", parts);
  const bool partial = opt_.partial_tokens > 0;
  LOOM_CHECK(!partial || carry, "partial rollouts need the carried groups");
  RolloutBatch out;
  const int P = opt_.prompts_per_step, G = opt_.group_size;
  const int max_seq = runner_->max_seq();
  const double t0 = now_seconds();
  // This batch's groups: the step's new prompts, then (partial rollouts) the groups whose
  // completions an earlier batch left unfinished, continued from these weights.
  std::vector<PromptGroup> groups;
  std::vector<std::vector<char>> done;         // per group and completion: finished for good
  std::vector<std::vector<int64_t>> requests;  // the engine requests of each group
  std::vector<int> open;
  std::vector<bool> aborted;
  for (int i = 0; i < P; ++i) {
    if (i % parts != part) continue;  // another rank's prompt
    PromptGroup g;
    g.target_step = target_step;
    g.version = version;
    g.task_index = uint64_t(target_step) * uint64_t(P) + uint64_t(i);
    g.task = env_.task(opt_.seed, g.task_index);
    g.prompt = chat_.prompt_ids({{"user", g.task.prompt}});
    g.rollouts.resize(size_t(G));
    groups.push_back(std::move(g));
    done.emplace_back(size_t(G), 0);
  }
  const size_t fresh = groups.size();
  if (carry) {
    for (PromptGroup& g : *carry) {
      g.target_step = target_step;
      std::vector<char> d(g.rollouts.size(), 0);
      for (size_t k = 0; k < g.rollouts.size(); ++k) d[k] = g.rollouts[k].finished;
      groups.push_back(std::move(g));
      done.push_back(std::move(d));
    }
    carry->clear();
  }
  open.assign(groups.size(), 0);
  aborted.assign(groups.size(), false);
  requests.assign(groups.size(), {});
  auto submit = [&](size_t i, const std::vector<int32_t>& prompt, int n, int max_tokens,
                    uint64_t seed, int completion) {
    infer::SamplingParams sp;
    sp.temperature = opt_.temperature;
    sp.max_tokens = max_tokens;
    sp.n = n;
    sp.seed = seed;
    sp.logprobs = 0;  // the sampled token's log-prob, of the logits / temperature (the learner's)
    sp.logprobs_at_temperature = true;
    open[i] += n;
    requests[i].push_back(
        engine_->submit(prompt, sp, [&, i, completion](const infer::TokenEvent& e) {
          // A group's first request samples all G completions (e.index); a continuation one.
          const size_t k = completion >= 0 ? size_t(completion) : size_t(e.index);
          Rollout& r = groups[i].rollouts[k];
          r.response.insert(r.response.end(), e.tokens.begin(), e.tokens.end());
          r.logprobs.insert(r.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
          r.versions.insert(r.versions.end(), e.logprobs.size(), version);
          r.text += e.text;
          out.generated_tokens += int64_t(e.tokens.size());
          if (e.finished) {
            if (e.stop_token >= 0) {
              r.response.push_back(e.stop_token);
              r.stopped = true;
            }
            if (e.finish_reason == "abort") aborted[i] = true;
            // Cut at this batch's slice (partial rollouts): it goes on in a later batch, unless it
            // stopped or reached its length or the context.
            const bool sliced = partial && e.finish_reason == "length" &&
                                int(r.response.size()) < opt_.max_tokens &&
                                int(groups[i].prompt.size() + r.response.size()) < max_seq;
            r.finished = !sliced;
            done[i][k] = r.finished;
            --open[i];
          }
        }));
  };
  const int slice = partial ? std::min(opt_.partial_tokens, opt_.max_tokens) : opt_.max_tokens;
  for (size_t i = 0; i < groups.size(); ++i) {
    PromptGroup& g = groups[i];
    if (i < fresh) {
      submit(i, g.prompt, G, slice, opt_.seed * 1000003 + g.task_index, -1);
      continue;
    }
    for (size_t k = 0; k < g.rollouts.size(); ++k) {
      const Rollout& r = g.rollouts[k];
      if (r.finished) continue;
      std::vector<int32_t> prompt = g.prompt;
      prompt.insert(prompt.end(), r.response.begin(), r.response.end());
      const int left = opt_.max_tokens - int(r.response.size());
      submit(i, prompt, 1, std::min(slice, left),
             continuation_seed(opt_.seed, g.task_index, k, r.response.size()), int(k));
    }
  }
  // Step the engine ourselves so that the deadline is checked between steps.
  const double deadline = opt_.rollout_timeout > 0 ? t0 + opt_.rollout_timeout : 0;
  while (engine_->step()) {
    if (deadline > 0 && now_seconds() > deadline) {
      for (size_t i = 0; i < groups.size(); ++i)
        if (open[i] > 0)
          for (int64_t id : requests[i]) engine_->cancel(id);
      break;
    }
  }
  engine_->run_until_idle();  // delivers the cancellations (and anything a step left)
  for (size_t i = 0; i < groups.size(); ++i) {
    PromptGroup& g = groups[i];
    if (aborted[i] || open[i] > 0) {
      ++out.dropped_timeout;
      continue;
    }
    // A group is as old as the oldest weights that generated any of its tokens.
    for (const Rollout& r : g.rollouts)
      for (int64_t v : r.versions) g.version = std::min(g.version, v);
    const bool finished = std::all_of(done[i].begin(), done[i].end(), [](char d) { return d; });
    if (!finished) {
      g.target_step = target_step + 1;  // continued by the next batch, for the next step
      carry->push_back(std::move(g));
      continue;
    }
    bool scored = true;
    for (Rollout& r : g.rollouts) {
      LOOM_CHECK(r.logprobs.size() == r.response.size() && r.versions.size() == r.response.size(),
                 "rollout of task ", g.task_index, ": ", r.logprobs.size(), " log-probs for ",
                 r.response.size(), " tokens");
      if (partial && r.versions.front() != r.versions.back()) {
        // Continued over several batches: its text from all of its tokens (the stop token is not
        // text), not from pieces decoded apart.
        r.text.clear();
        const size_t n = r.response.size() - (r.stopped ? 1 : 0);
        for (size_t t = 0; t < n; ++t)
          if (r.response[t] < tok_.vocab_size()) tok_.decode_append(r.response[t], r.text);
      }
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
