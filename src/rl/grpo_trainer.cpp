#include "rl/grpo_trainer.h"

#include "train/batch.h"

#include <cmath>

#include "core/error.h"
#include "core/log.h"

namespace loom::rl {

Json RlStepStats::json() const {
  Json j = Json::object();
  j["step"] = step;
  j["reward_mean"] = reward_mean;
  j["reward_std"] = reward_std;
  j["accuracy"] = accuracy;
  j["response_length"] = response_length;
  j["loss"] = loss;
  j["kl"] = kl;
  j["clip_fraction"] = clip_fraction;
  j["grad_norm"] = grad_norm;
  j["groups"] = groups;
  j["zero_advantage_groups"] = zero_advantage_groups;
  j["train_tokens"] = train_tokens;
  j["rollout_seconds"] = rollout_seconds;
  j["learner_seconds"] = learner_seconds;
  j["generation_tokens_per_s"] = generation_tokens_per_s;
  return j;
}

GrpoTrainer::GrpoTrainer(Decoder& policy, const data::BpeTokenizer& tok,
                         const data::ChatTemplate& chat, const Environment& env,
                         const RlOptions& opt)
    : policy_(policy), tok_(tok), chat_(chat), env_(env), opt_(opt) {
  LOOM_CHECK(opt.prompts_per_step > 0 && opt.group_size > 1, "GRPO needs prompts and groups of ",
             "at least 2 completions (group_size = ", opt.group_size, ")");
  LOOM_CHECK(opt.max_tokens > 0, "max_tokens must be positive");
  LOOM_CHECK(policy.act_dtype() == DType::F32, "GRPO runs the fp32 policy for now");
  if (opt.grpo.beta > 0) {
    reference_ = std::make_unique<Decoder>(policy.config(), cpu_backend());
    std::copy(policy.params().data(), policy.params().data() + policy.params().total(),
              reference_->params().data());
  }
  optim_ = std::make_unique<AdamW>(policy.params(), opt.adam, DType::F32, cpu_backend());
  runner_ = std::make_unique<infer::DecoderRunner>(policy);
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

RlStepStats GrpoTrainer::step() {
  RlStepStats st;
  st.step = step_;
  const int P = opt_.prompts_per_step, G = opt_.group_size;
  // 1. Rollouts from the current weights.
  const double t0 = now_seconds();
  struct Completion {
    std::vector<int32_t> response;  // sampled tokens, the stop token included
    std::string text;
  };
  std::vector<Task> tasks(static_cast<size_t>(P));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(P));
  std::vector<std::vector<Completion>> outs(static_cast<size_t>(P),
                                            std::vector<Completion>(static_cast<size_t>(G)));
  int64_t generated = 0;
  for (int i = 0; i < P; ++i) {
    const uint64_t index = uint64_t(step_) * uint64_t(P) + uint64_t(i);
    tasks[size_t(i)] = env_.task(opt_.seed, index);
    prompts[size_t(i)] = chat_.prompt_ids({{"user", tasks[size_t(i)].prompt}});
    infer::SamplingParams sp;
    sp.temperature = opt_.temperature;
    sp.max_tokens = opt_.max_tokens;
    sp.n = G;
    sp.seed = opt_.seed * 1000003 + index;
    engine_->submit(prompts[size_t(i)], sp, [&, i](const infer::TokenEvent& e) {
      Completion& c = outs[size_t(i)][size_t(e.index)];
      c.response.insert(c.response.end(), e.tokens.begin(), e.tokens.end());
      c.text += e.text;
      generated += int64_t(e.tokens.size());
      if (e.finished && e.stop_token >= 0) c.response.push_back(e.stop_token);
    });
  }
  engine_->run_until_idle();
  st.rollout_seconds = now_seconds() - t0;
  st.generation_tokens_per_s = generated / std::max(st.rollout_seconds, 1e-9);

  // 2. Rewards and group-relative advantages.
  std::vector<GrpoSample> samples;
  std::vector<std::pair<int, int>> which;  // (prompt, completion) of each sample
  double sum = 0, sq = 0, correct = 0, length = 0;
  for (int i = 0; i < P; ++i) {
    std::vector<double> r(static_cast<size_t>(G));
    for (int g = 0; g < G; ++g) {
      r[size_t(g)] = env_.reward(tasks[size_t(i)], outs[size_t(i)][size_t(g)].text);
      sum += r[size_t(g)];
      sq += r[size_t(g)] * r[size_t(g)];
      correct += r[size_t(g)] >= 1.0;
      length += double(outs[size_t(i)][size_t(g)].response.size());
    }
    ++st.groups;
    const bool all_equal = std::all_of(r.begin(), r.end(), [&](double x) { return x == r[0]; });
    if (all_equal) {  // no signal: no gradient
      ++st.zero_advantage_groups;
      continue;
    }
    const std::vector<double> a = group_advantages(r, opt_.grpo);
    for (int g = 0; g < G; ++g) {
      if (outs[size_t(i)][size_t(g)].response.empty()) continue;
      GrpoSample s;
      s.advantage = a[size_t(g)];
      samples.push_back(std::move(s));
      which.push_back({i, g});
    }
  }
  const double n = double(P) * G;
  st.reward_mean = sum / n;
  st.reward_std = std::sqrt(std::max(0.0, sq / n - st.reward_mean * st.reward_mean));
  st.accuracy = correct / n;
  st.response_length = length / n;

  // 3. One learner step on the samples that carry a gradient.
  const double t1 = now_seconds();
  if (!samples.empty()) {
    Batch b;
    b.cu_seqlens.assign(1, 0);
    std::vector<std::pair<int, int>> span;  // [first response target row, count) per sample
    for (size_t k = 0; k < samples.size(); ++k) {
      const auto& pr = prompts[size_t(which[k].first)];
      const auto& resp = outs[size_t(which[k].first)][size_t(which[k].second)].response;
      const int base = static_cast<int>(b.tokens.size());
      std::vector<int32_t> seq = pr;
      seq.insert(seq.end(), resp.begin(), resp.end());
      const int len = std::min<int>(static_cast<int>(seq.size()), policy_.config().max_seq);
      for (int t = 0; t < len; ++t) {
        b.tokens.push_back(seq[size_t(t)]);
        b.positions.push_back(t);
        // Row t predicts seq[t + 1]; the response's tokens are the targets.
        const bool target = t + 1 < len && t + 1 >= static_cast<int>(pr.size());
        b.targets.push_back(target ? seq[size_t(t + 1)] : -1);
      }
      b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
      const int first = std::max(0, static_cast<int>(pr.size()) - 1);
      span.push_back({base + first, std::max(0, len - 1 - first)});
    }
    ModelInput in = b.input();
    StepOutputs now, ref;
    now.want_token_logprobs = ref.want_token_logprobs = true;
    policy_.forward_loss(in, &now);
    if (reference_) reference_->forward_loss(in, &ref);
    for (size_t k = 0; k < samples.size(); ++k) {
      auto [first, count] = span[k];
      for (int t = 0; t < count; ++t) {
        const double lp = now.token_logprobs[size_t(first + t)];
        samples[k].logp.push_back(lp);
        samples[k].logp_old.push_back(lp);  // on policy: the weights that sampled them
        if (reference_) samples[k].logp_ref.push_back(ref.token_logprobs[size_t(first + t)]);
      }
    }
    std::vector<std::vector<double>> w;
    const GrpoStats gs = grpo_token_weights(samples, opt_.grpo, &w);
    std::vector<float> weights(b.tokens.size(), 0.f);
    for (size_t k = 0; k < samples.size(); ++k)
      for (int t = 0; t < span[k].second; ++t)
        weights[size_t(span[k].first + t)] = static_cast<float>(w[k][size_t(t)]);
    in.loss_weights = weights.data();
    ParamSet& Pm = policy_.params();
    Pm.zero_grad();
    policy_.forward_backward(in, 1.f);
    const double norm = std::sqrt(cpu_backend().sum_squares(Pm.grad(), Pm.total()));
    float scale = 1.f;
    if (opt_.clip_grad > 0 && norm > opt_.clip_grad) scale = float(opt_.clip_grad / norm);
    if (std::isfinite(norm)) optim_->step(opt_.lr, scale);
    engine_->weights_updated();  // cached prefixes hold the old weights' keys and values
    st.loss = gs.loss;
    st.kl = gs.kl;
    st.clip_fraction = gs.clip_fraction;
    st.grad_norm = norm;
    st.train_tokens = gs.tokens;
  }
  st.learner_seconds = now_seconds() - t1;
  ++step_;
  return st;
}

}  // namespace loom::rl
