#include "rl/grpo_trainer.h"

#include "train/batch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "parallel/tensor_parallel.h"

namespace loom::rl {

namespace {

// Sequences [k0, k1) of a packed batch, as a packed batch of their own.
Batch sequences_of(const Batch& b, size_t k0, size_t k1) {
  const int32_t lo = b.cu_seqlens[k0], hi = b.cu_seqlens[k1];
  Batch c;
  c.tokens.assign(b.tokens.begin() + lo, b.tokens.begin() + hi);
  c.positions.assign(b.positions.begin() + lo, b.positions.begin() + hi);
  c.targets.assign(b.targets.begin() + lo, b.targets.begin() + hi);
  for (size_t k = k0; k <= k1; ++k) c.cu_seqlens.push_back(b.cu_seqlens[k] - lo);
  return c;
}

// Sequence parallelism splits a pass's tokens evenly over the tensor-parallel group: a batch
// whose count does not split gets one more sequence of padding (token 0 at positions 0, 1, ...,
// no targets: loss weight 0), which attends only to itself and adds no loss and no gradient.
// Exact for a dense model; check_learner_grid refuses a MoE policy whose routing it would change.
void pad_for_sequence_parallel(Batch& b, const Decoder& m) {
  const TensorParallel& tp = m.tensor_parallel();
  if (tp.size == 1 || !tp.sequence_parallel || b.tokens.empty()) return;
  const int n = static_cast<int>(b.tokens.size()), pad = (tp.size - n % tp.size) % tp.size;
  if (pad == 0) return;
  for (int t = 0; t < pad; ++t) {
    b.tokens.push_back(0);
    b.positions.push_back(t);
    b.targets.push_back(-1);
  }
  b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
}

// Expert parallelism: a pass of padding that every rank of the EP group can run alongside the
// others' real passes (their token exchanges need every rank): one token, no target.
Batch padding_pass(const Decoder& m) {
  Batch c;
  c.tokens = {0};
  c.positions = {0};
  c.targets = {-1};
  c.cu_seqlens = {0, 1};
  pad_for_sequence_parallel(c, m);
  return c;
}

}  // namespace

int64_t restore_learner(const RlRestore& restore, Decoder& policy, GrpoLearner& learner) {
  if (!restore) return 0;
  StepEngine& engine = learner.engine().engine();
  const int64_t step =
      restore(policy, learner.optimizer(), engine.loss_scaling() ? &engine.scaler() : nullptr);
  learner.engine().weights_restored();
  return step;
}

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
  if (train_tokens > 0) j["entropy"] = entropy;  // nothing trained: no tokens to measure it on
  j["grad_norm"] = grad_norm;
  j["groups"] = groups;
  j["zero_advantage_groups"] = zero_advantage_groups;
  j["train_tokens"] = train_tokens;
  j["rollout_seconds"] = rollout_seconds;
  j["learner_seconds"] = learner_seconds;
  if (helper_seconds > 0) j["helper_seconds"] = helper_seconds;
  j["generation_tokens_per_s"] = generation_tokens_per_s;
  j["train_tokens_per_s"] = train_tokens_per_s;
  j["is_weight_mean"] = is_weight_mean;
  j["learner_wait_seconds"] = learner_wait_seconds;
  j["rollout_utilisation"] = rollout_utilisation;
  j["learner_utilisation"] = learner_utilisation;
  Json h = Json::array();
  for (int64_t n : staleness) h.push_back(Json(n));
  j["staleness"] = h;
  j["dropped_timeout"] = dropped_timeout;
  j["dropped_env"] = dropped_env;
  j["dropped_stale"] = dropped_stale;
  j["spanning_rollouts"] = spanning_rollouts;
  return j;
}

GrpoLearner::GrpoLearner(Decoder& policy, const RlOptions& opt, comm::Communicator* dp,
                         comm::Communicator* expert_dp, comm::Communicator* learners)
    : policy_(policy), opt_(opt), dp_(dp && dp->size() > 1 ? dp : nullptr) {
  if (policy.expert_parallel().size > 1) {
    LOOM_CHECK(dp_, "an expert-parallel learner needs the data-parallel learners it splits the ",
               "experts over");
    ep_ = policy.expert_parallel().comm;
    edp_ = expert_dp && expert_dp->size() > 1 ? expert_dp : nullptr;
  }
  // Every pass exchanges data with a group: the EP group's token exchanges, or ZeRO-3's
  // gathers of each block over the data-parallel learners.
  lockstep_ = ep_ ? ep_ : opt.zero == 3 ? dp_ : nullptr;
  LOOM_CHECK(!(ep_ && opt.zero == 3), "ZeRO-3 GRPO learners with expert parallelism");
  LOOM_CHECK(opt.prompts_per_step > 0 && opt.group_size > 1, "GRPO needs prompts and groups of ",
             "at least 2 completions (group_size = ", opt.group_size, ")");
  LOOM_CHECK(opt.max_tokens > 0, "max_tokens must be positive");
  LOOM_CHECK(opt.learner_share >= 0 && opt.learner_share < 1, "rl.learner_share must lie in ",
             "[0, 1), not ", opt.learner_share);
  // The share's gradients are added to the rest's in the model's buffer before the engine's
  // reduction reads it: one learner at ZeRO-0 (whose reduction leaves the buffer as it is), and
  // the helper's copy of the weights is fp32 (so its gradients are the learner's own).
  LOOM_CHECK(opt.learner_share == 0 || (opt.zero == 0 && opt.precision.compute == DType::F32),
             "rl.learner_share needs parallel.zero = 0 and precision.policy = \"fp32\" (got zero ",
             opt.zero, ", \"", opt.precision.name, "\")");
  LearnerEngineOptions eo;
  eo.adam = opt.adam;
  eo.clip_grad = opt.clip_grad;
  eo.precision = opt.precision;
  eo.scaler = opt.scaler;
  eo.zero = opt.zero;
  eo.grad_reduce = opt.grad_reduce;
  eo.reference = opt.grpo.beta > 0;
  // Under TP or EP the gradient norm sums every learner's part; with plain data parallelism
  // the engine's own group holds the disjoint parts.
  engine_ = std::make_unique<LearnerEngine>(policy, eo, dp_, expert_dp,
                                            learners && learners->size() > 1 ? learners : dp_);
  reference_ = engine_->reference();
}

void GrpoLearner::learn(const std::vector<PromptGroup>& groups, int64_t version, RlStepStats* stp) {
  RlStepStats& st = *stp;
  // 1. Rewards and group-relative advantages (of this learner's share of the groups).
  std::vector<GrpoSample> samples;
  std::vector<std::pair<size_t, size_t>> which;  // (group, completion) of each sample
  double sum = 0, sq = 0, correct = 0, length = 0, n = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const PromptGroup& gr = groups[i];
    const int64_t age = version - gr.version;
    LOOM_CHECK(age >= 0, "a group of weight version ", gr.version, " reached learner version ",
               version);
    if (st.staleness.size() <= size_t(age)) st.staleness.resize(size_t(age) + 1, 0);
    ++st.staleness[size_t(age)];
    std::vector<double> r;
    for (const Rollout& ro : gr.rollouts) {
      if (!ro.versions.empty() && ro.versions.front() != ro.versions.back()) ++st.spanning_rollouts;
      r.push_back(ro.reward);
      sum += ro.reward;
      sq += ro.reward * ro.reward;
      correct += ro.reward >= 1.0;
      length += double(ro.response.size());
      n += 1;
    }
    ++st.groups;
    const bool all_equal = std::all_of(r.begin(), r.end(), [&](double x) { return x == r[0]; });
    if (all_equal) {  // no signal: no gradient
      ++st.zero_advantage_groups;
      continue;
    }
    const std::vector<double> a = group_advantages(r, opt_.grpo);
    for (size_t g = 0; g < gr.rollouts.size(); ++g) {
      if (gr.rollouts[g].response.empty()) continue;
      GrpoSample s;
      s.advantage = a[g];
      samples.push_back(std::move(s));
      which.push_back({i, g});
    }
  }

  // 2. The packed batch of the samples that carry a gradient.
  const double t1 = now_seconds();
  Batch b;
  b.cu_seqlens.assign(1, 0);
  std::vector<std::pair<int, int>> span;  // [first response target row, count) per sample
  GrpoTotals totals;
  for (size_t k = 0; k < samples.size(); ++k) {
    const auto& pr = groups[which[k].first].prompt;
    const auto& resp = groups[which[k].first].rollouts[which[k].second].response;
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
    totals.tokens += span.back().second;
    totals.sequences += span.back().second > 0;
  }

  // 3. Data parallelism: the step's counts over every learner's share (the normalisation of
  // the GRPO loss is the whole batch's, so that the learners' gradients sum to its gradient).
  // The MoE auxiliary loss is averaged over every token the learners route this step, as the
  // trainer averages it (ModelInput::aux_weight); the passes below carry dloss = 1.
  double routed_tokens = double(b.tokens.size());
  if (dp_) {
    routed_tokens = dp_->all_reduce_scalar(routed_tokens, comm::ReduceOp::Sum);
    const int64_t ages = dp_->all_reduce_scalar(int64_t(st.staleness.size()), comm::ReduceOp::Max);
    st.staleness.resize(size_t(ages), 0);
    std::vector<double> c = {sum,
                             sq,
                             correct,
                             length,
                             n,
                             double(st.groups),
                             double(st.zero_advantage_groups),
                             double(totals.tokens),
                             double(totals.sequences),
                             double(st.spanning_rollouts)};
    for (int64_t x : st.staleness) c.push_back(double(x));
    dp_->all_reduce_f64(c.data(), int64_t(c.size()), comm::ReduceOp::Sum);
    sum = c[0], sq = c[1], correct = c[2], length = c[3], n = c[4];
    st.groups = int64_t(c[5]), st.zero_advantage_groups = int64_t(c[6]);
    totals.tokens = int64_t(c[7]), totals.sequences = int64_t(c[8]);
    st.spanning_rollouts = int64_t(c[9]);
    for (size_t k = 0; k < st.staleness.size(); ++k) st.staleness[k] = int64_t(c[10 + k]);
  }
  if (n > 0) {
    st.reward_mean = sum / n;
    st.reward_std = std::sqrt(std::max(0.0, sq / n - st.reward_mean * st.reward_mean));
    st.accuracy = correct / n;
    st.response_length = length / n;
  }

  // 4. One learner step, when any learner has a token to train on.
  if (totals.tokens > 0) {
    pad_for_sequence_parallel(b, policy_);  // after the spans: they index the rows before it
    ModelInput in = b.input();
    in.aux_weight = static_cast<float>(1.0 / routed_tokens);
    // Log-probabilities (and entropy) of the distribution the rollouts sampled from: the
    // logits divided by the sampling temperature, in the logit passes and the backward alike.
    const float logit_scale = 1.f / opt_.temperature;
    in.logit_scale = logit_scale;
    // The logits of the response tokens' rows, from a forward pass each of the policy and the
    // reference: the log-probs of the sampled tokens and the policy's entropy there. The rows x
    // vocabulary logits are taken a run of whole sequences at a time, at most logit_rows rows
    // (default: 64 MiB of logits) a pass, so that a large vocabulary does not need them all at
    // once; a batch within the budget is one pass over the batch as the step sees it.
    const int V = policy_.config().vocab;
    const int64_t budget =
        opt_.logit_rows > 0 ? opt_.logit_rows : std::max<int64_t>(1, (int64_t(1) << 24) / V);
    double entropy_sum = 0;
    std::vector<float> logits, ref_logits;
    std::vector<std::pair<size_t, size_t>> passes;  // sequences [k0, k1) of each pass with rows
    for (size_t k0 = 0; k0 < samples.size();) {
      size_t k1 = k0;
      int64_t nrows = 0;
      while (k1 < samples.size() && (k1 == k0 || nrows + span[k1].second <= budget))
        nrows += span[k1++].second;
      if (nrows > 0) passes.push_back({k0, k1});
      k0 = k1;
    }
    const bool any_rows = !passes.empty();
    // Expert parallelism (each pass exchanges tokens over the EP group) and ZeRO-3 (each pass
    // gathers the blocks over the learners): every rank of the group runs as many passes as the
    // one with the most; a rank with fewer runs padding passes (their logits unread).
    const int64_t npass =
        lockstep_ ? lockstep_->all_reduce_scalar(int64_t(passes.size()), comm::ReduceOp::Max)
                  : int64_t(passes.size());
    for (int64_t pi = int64_t(passes.size()); pi < npass; ++pi) {
      const Batch c = padding_pass(policy_);
      logits.resize(size_t(V));
      policy_.forward_logits(c.input(), {0}, logits.data());
      if (reference_) reference_->forward_logits(c.input(), {0}, logits.data());
    }
    for (auto [k0, k1] : passes) {
      const int32_t lo = b.cu_seqlens[k0];
      Batch c = sequences_of(b, k0, k1);
      pad_for_sequence_parallel(c, policy_);
      std::vector<int> rows;
      for (size_t k = k0; k < k1; ++k)
        for (int t = 0; t < span[k].second; ++t) rows.push_back(span[k].first - lo + t);
      const size_t chunk_k0 = k0;
      ModelInput cin = c.input();
      cin.logit_scale = logit_scale;
      logits.resize(rows.size() * size_t(V));
      policy_.forward_logits(cin, rows, logits.data());
      if (reference_) {
        ref_logits.resize(logits.size());
        reference_->forward_logits(cin, rows, ref_logits.data());
      }
      size_t row = 0;
      for (size_t k = chunk_k0; k < k1; ++k) {
        auto [first, count] = span[k];
        const PromptGroup& gr = groups[which[k].first];
        const Rollout& ro = gr.rollouts[which[k].second];
        // Generated by older weights: importance-weight by the behaviour log-probs recorded at
        // sampling. On policy the behaviour policy is these weights: weight 1, exactly the
        // synchronous algorithm (the engine's log-probs differ from the trainer's in the last
        // bits). Per token: a partial rollout's tokens of the learner's own version weigh 1 too.
        const bool stale = gr.version < version;
        for (int t = 0; t < count; ++t, ++row) {
          const int target = b.targets[size_t(first + t)];
          double lp = 0, h = 0, rlp = 0, rh = 0;
          logprob_and_entropy(logits.data() + row * size_t(V), V, target, &lp, &h);
          entropy_sum += h;
          samples[k].logp.push_back(lp);
          samples[k].logp_old.push_back(lp);  // the learner's weights before this step
          if (reference_) {
            logprob_and_entropy(ref_logits.data() + row * size_t(V), V, target, &rlp, &rh);
            samples[k].logp_ref.push_back(rlp);
          }
          if (stale) {
            const bool old_token = ro.versions.empty() || ro.versions[size_t(t)] < version;
            samples[k].logp_gen.push_back(old_token ? double(ro.logprobs[size_t(t)]) : lp);
          }
        }
      }
    }
    std::vector<std::vector<double>> w;
    GrpoStats gs = grpo_token_weights(samples, opt_.grpo, &w, &totals);
    ParamSet& Pm = policy_.params();
    StepEngine& engine = engine_->engine();
    // fp16: the backward carries the loss scaler's scale (1 otherwise).
    const float dloss = static_cast<float>(engine.loss_scale());
    engine_->recipes().begin_step();
    // One micro-batch: this learner's passes; the engine reduces the gradients over the
    // learners as their buckets fill (a learner with nothing to train on reduces zeros).
    engine.accumulate(1, [&](int) {
      if (any_rows) {
        std::vector<float> weights(b.tokens.size(), 0.f);
        for (size_t k = 0; k < samples.size(); ++k)
          for (int t = 0; t < span[k].second; ++t)
            weights[size_t(span[k].first + t)] = static_cast<float>(w[k][size_t(t)]);
        // The learner_share: the last sequences, about that share of the batch's tokens.
        const size_t n = samples.size();
        size_t ks = n;
        if (opt_.learner_share > 0 && !dp_ && policy_.tensor_parallel().size == 1)
          while (ks > 1 && double(b.tokens.size() - size_t(b.cu_seqlens[ks - 1])) <=
                               opt_.learner_share * double(b.tokens.size()))
            --ks;
        if (ks == n) {
          in.loss_weights = weights.data();
          const double f0 = now_seconds();
          policy_.forward_backward(in, dloss);
          fb_seconds_per_token_ = (now_seconds() - f0) / double(in.N);
        } else {
          // Two passes whose gradients are added, each over whole sequences with the whole
          // batch's token weights (as data-parallel shares are).
          const Batch own = sequences_of(b, 0, ks), share = sequences_of(b, ks, n);
          ModelInput own_in = own.input(), share_in = share.input();
          own_in.loss_weights = weights.data();
          share_in.loss_weights = weights.data() + b.cu_seqlens[ks];
          own_in.aux_weight = share_in.aux_weight = in.aux_weight;
          own_in.logit_scale = share_in.logit_scale = logit_scale;
          // The helper may start while it can finish no later than the learner's own part, as
          // the last step's speed predicts (no prediction yet: any time).
          const double f0 = now_seconds();
          const double latest = fb_seconds_per_token_ > 0
                                    ? f0 + fb_seconds_per_token_ * double(own_in.N - share_in.N)
                                    : std::numeric_limits<double>::infinity();
          if (helper_) helper_->offer(share_in, version, latest);
          try {
            policy_.forward_backward(own_in, dloss);
          } catch (...) {
            // The helper may be reading `share`: it must be done with it (or the offer withdrawn)
            // before the batch goes; the first error is the one to report.
            double ignored = 0;
            try {
              if (helper_) helper_->collect(&ignored);
            } catch (...) {
            }
            throw;
          }
          fb_seconds_per_token_ = (now_seconds() - f0) / double(own_in.N);
          const float* g = helper_ ? helper_->collect(&st.helper_seconds) : nullptr;
          if (!g) {
            // Nobody took it: computed here, apart from the rest, so the sum has the bits the
            // helper's would have (the same weights, kernels and order of the addition).
            share_grad_.assign(Pm.grad(), Pm.grad() + Pm.total());
            Pm.zero_grad();
            policy_.forward_backward(share_in, dloss);
            g = share_grad_.data();
          }
          float* grad = Pm.grad();
          for (int64_t i = 0; i < Pm.total(); ++i) grad[i] += g[i];
        }
      } else if (lockstep_) {
        // Nothing to train on here, but the group's passes exchange tokens with this rank (EP)
        // or gather its blocks (ZeRO-3): a padding pass with no loss weight and no auxiliary-loss
        // weight adds zero gradients.
        const Batch c = padding_pass(policy_);
        std::vector<float> zeros(c.tokens.size(), 0.f);
        ModelInput pin = c.input();
        pin.loss_weights = zeros.data();
        pin.aux_weight = 0.f;
        policy_.forward_backward(pin, dloss);
      }
    });
    if (dp_) {
      // The engine summed the shares' gradients to the batch's (the experts, the buffer's tail,
      // over the groups holding the same experts); the statistics' sums follow.
      std::vector<double> parts = {gs.loss, gs.kl, gs.clip_fraction, gs.mean_is_weight,
                                   entropy_sum};
      dp_->all_reduce_f64(parts.data(), int64_t(parts.size()), comm::ReduceOp::Sum);
      gs.loss = parts[0], gs.kl = parts[1], gs.clip_fraction = parts[2];
      gs.mean_is_weight = parts[3], entropy_sum = parts[4];
    }
    // The global norm, the skip of non-finite gradients, clipping and the optimizer step.
    const StepEngine::Update u = engine.step(opt_.lr, engine.loss_scale(), version);
    const double norm = u.grad_norm;
    if (!u.skipped) engine_->recipes().new_weights();
    st.loss = gs.loss;
    st.kl = gs.kl;
    st.clip_fraction = gs.clip_fraction;
    st.is_weight_mean = gs.mean_is_weight;
    st.grad_norm = norm;
    st.train_tokens = gs.tokens;
    st.entropy = entropy_sum / double(totals.tokens);
  }
  st.learner_seconds = now_seconds() - t1;
  st.train_tokens_per_s = double(st.train_tokens) / std::max(st.learner_seconds, 1e-9);
}

GrpoTrainer::GrpoTrainer(Decoder& policy, const data::BpeTokenizer& tok,
                         const data::ChatTemplate& chat, const Environment& env,
                         const RlOptions& opt, const RlRestore& restore)
    : opt_(opt),
      learner_(policy, opt_),
      step_(restore_learner(restore, policy, learner_)),
      rollout_(policy, tok, chat, env, opt_) {}

RlStepStats GrpoTrainer::step() {
  RlStepStats st;
  st.step = step_;
  // Rollouts from the current weights, then one learner step on them.
  RolloutBatch rb = rollout_.generate(step_, step_);
  st.rollout_seconds = rb.seconds;
  st.generation_tokens_per_s = double(rb.generated_tokens) / std::max(rb.seconds, 1e-9);
  st.dropped_timeout = rb.dropped_timeout;
  st.dropped_env = rb.dropped_env;
  learner_.learn(rb.groups, step_, &st);
  rollout_.weights_updated();  // cached prefixes hold the old weights' keys and values
  // Each side idles while the other works.
  const double total = std::max(st.rollout_seconds + st.learner_seconds, 1e-9);
  st.rollout_utilisation = st.rollout_seconds / total;
  st.learner_utilisation = st.learner_seconds / total;
  ++step_;
  return st;
}

}  // namespace loom::rl
