#include "train/dpo_recipe.h"

#include <algorithm>

#include "core/error.h"

namespace loom {

DpoOptions dpo_options_from(const Config& cfg) {
  DpoOptions o;
  o.beta = cfg.get_double("dpo.beta", o.beta);
  LOOM_CHECK(o.beta > 0 && o.beta <= 100, "dpo.beta must lie in (0, 100], got ", o.beta);
  o.loss = dpo_loss_from_name(cfg.get_string("dpo.loss", dpo_loss_name(o.loss)));
  LOOM_CHECK(cfg.get_string("data.source", "text") == "preference",
             "train.mode = \"dpo\" needs data.source = \"preference\"");
  // Each loss's own keys, refused under another loss rather than silently unused.
  auto own = [&](const char* key, DpoLoss l) {
    LOOM_CHECK(!cfg.has(key) || o.loss == l, key, " (", cfg.where(key),
               ") applies to dpo.loss = \"", dpo_loss_name(l), "\" only, not \"",
               dpo_loss_name(o.loss), "\"");
  };
  own("dpo.simpo_gamma", DpoLoss::Simpo);
  own("dpo.cpo_alpha", DpoLoss::Simpo);
  own("dpo.desirable_weight", DpoLoss::Kto);
  own("dpo.undesirable_weight", DpoLoss::Kto);
  o.simpo_gamma = cfg.get_double("dpo.simpo_gamma", o.simpo_gamma, 0, 100);
  o.cpo_alpha = cfg.get_double("dpo.cpo_alpha", o.cpo_alpha, 0, 100);
  o.desirable_weight = cfg.get_double("dpo.desirable_weight", o.desirable_weight, 0, 100);
  o.undesirable_weight = cfg.get_double("dpo.undesirable_weight", o.undesirable_weight, 0, 100);
  LOOM_CHECK(o.desirable_weight > 0 || o.undesirable_weight > 0,
             "dpo.desirable_weight and dpo.undesirable_weight are both 0: nothing to learn");
  return o;
}

std::vector<std::pair<std::string, double>> DpoRecipe::Stats::report(DpoLoss l,
                                                                     const std::string& pre) const {
  const double n = double(std::max<int64_t>(1, pairs));
  if (l == DpoLoss::Kto) {
    const double nd = double(std::max<int64_t>(1, desirable));
    const double nu = double(std::max<int64_t>(1, pairs - desirable));
    return {{pre + "rewards_chosen", reward_chosen / nd},
            {pre + "rewards_rejected", reward_rejected / nu},
            {pre + "reward_margin", reward_chosen / nd - reward_rejected / nu},
            {pre + "kl", kl / n}};
  }
  std::vector<std::pair<std::string, double>> r = {
      {pre + "rewards_chosen", reward_chosen / n},
      {pre + "rewards_rejected", reward_rejected / n},
      {pre + "reward_margin", (reward_chosen - reward_rejected) / n},
      {pre + "reward_accuracy", correct / n}};
  if (l == DpoLoss::Simpo || l == DpoLoss::Orpo) r.push_back({pre + "nll", nll / n});
  return r;
}

DpoRecipe::Stats& DpoRecipe::Stats::operator+=(const Stats& o) {
  loss += o.loss;
  reward_chosen += o.reward_chosen;
  reward_rejected += o.reward_rejected;
  correct += o.correct;
  nll += o.nll;
  kl += o.kl;
  pairs += o.pairs;
  desirable += o.desirable;
  return *this;
}

void DpoRecipe::Stats::all_reduce(comm::Communicator& g) {
  loss = g.all_reduce_scalar(loss, comm::ReduceOp::Sum);
  reward_chosen = g.all_reduce_scalar(reward_chosen, comm::ReduceOp::Sum);
  reward_rejected = g.all_reduce_scalar(reward_rejected, comm::ReduceOp::Sum);
  correct = g.all_reduce_scalar(correct, comm::ReduceOp::Sum);
  nll = g.all_reduce_scalar(nll, comm::ReduceOp::Sum);
  kl = g.all_reduce_scalar(kl, comm::ReduceOp::Sum);
  pairs = g.all_reduce_scalar(pairs, comm::ReduceOp::Sum);
  desirable = g.all_reduce_scalar(desirable, comm::ReduceOp::Sum);
}

// One step's gradients: the loss is a mean over the global batch's pairs (every DP rank's), as
// in one process.
DpoRecipe::Stats DpoRecipe::gradients(std::vector<Batch>& micro_batches, BatchSource& data,
                                      int64_t step) {
  step_ = step;
  const int64_t pairs = int64_t(s_.opt.micro_batch) * s_.opt.grad_accum * s_.pg->dp().size();
  Stats total;
  // The pipeline's schedule counts as one micro-batch.
  s_.engine->accumulate(s_.pipe ? 1 : static_cast<int>(micro_batches.size()), [&](int j) {
    if (s_.pipe) {
      for (Batch& b : micro_batches) data.next(b);
      total = pipeline(micro_batches, true, pairs);
      return;
    }
    Batch& b = micro_batches[size_t(j)];
    data.next(b);
    // The policy's forward-only pass and its backward draw the same dropout mask, so the
    // log-probabilities in the loss are those of the function differentiated.
    LoraDropoutScope drop(s_.lora.get(), s_.global_micro(step, size_t(j)));
    total += micro(b, true, pairs);
  });
  // The TP ranks of a DP group hold the same figures: sum over DP only.
  total.all_reduce(s_.pg->dp());
  return total;
}

// The DPO loss of held-out pairs (summed) and their statistics, forward only.
DpoRecipe::Stats DpoRecipe::evaluate(BatchSource& valid, int batches) {
  Stats total;
  if (s_.pipe) {
    std::vector<Batch> all(size_t(std::max(0, batches)));
    for (Batch& v : all) valid.next(v);
    return pipeline(all, false, 1);
  }
  Batch b;
  for (int i = 0; i < batches; ++i) {
    valid.next(b);
    total += micro(b, false, 1);
  }
  return total;
}

// The DPO loss is normalised by pairs in its token weights and passes dloss = 1; a MoE
// model's auxiliary loss is averaged over the step's routed tokens as in pre-training (every
// micro-batch's, on every DP and CP rank: micro-batches of one shape).
float DpoRecipe::aux_weight(const ModelInput& in) const {
  const double tokens = double(in.N) * double(s_.opt.grad_accum) * double(s_.pg->dp().size()) *
                        double(s_.pg->cp().size());
  return static_cast<float>(1.0 / tokens);
}

DpoRecipe::Stats DpoRecipe::micro(const Batch& b, bool backward, int64_t pairs_in_step) {
  // Under context parallelism this rank's chunks of the pairs (the sequences stay in order, so
  // pair k is still local sequences 2k and 2k+1), erased again on the way out.
  ModelInput in = s_.inputs->of(b);
  struct Forget {
    CpInputs& inputs;
    const Batch& b;
    ~Forget() { inputs.forget(b); }
  } forget{*s_.inputs, b};
  // LoRA dropout (gradients() set the micro-batch): under CP by the tokens' micro-batch rows.
  if (s_.lora && s_.lora->dropout_active())
    s_.lora->set_dropout_batch(s_.lora->dropout_micro(), s_.inputs->rows(in));
  StepOutputs ref, pol;
  if (!uses_reference(opt_.loss)) {
    // SimPO, ORPO: no reference pass.
  } else if (s_.lora) {
    s_.lora->set_attached(false);
    s_.model->forward_loss(in, &ref);
    s_.lora->set_attached(true);
  } else {
    s_.reference.model->forward_loss(in, &ref);
  }
  s_.model->forward_loss(in, &pol);
  std::vector<float> w;
  const Stats st = terms(b, in, ref, pol, pairs_in_step, w);
  if (backward) {
    in.loss_weights = w.data();
    in.aux_weight = aux_weight(in);
    s_.model->forward_backward(in, 1.f);
  }
  return st;
}

DpoRecipe::Stats DpoRecipe::sequence_terms(const DpoOptions& o, const std::vector<double>& pi,
                                           const std::vector<double>& ref,
                                           const std::vector<int64_t>& n,
                                           const std::vector<int8_t>& labels, int64_t pairs_in_step,
                                           std::vector<double>* weight) {
  Stats st;
  st.pairs = int64_t(pi.size()) / 2;
  weight->assign(pi.size(), 0.0);
  const auto refp = [&](size_t q) { return ref.empty() ? 0.0 : ref[q]; };
  if (o.loss == DpoLoss::Kto) {
    LOOM_CHECK(labels.size() == size_t(st.pairs),
               "a KTO micro-batch needs a label per example, got ", labels.size(), " for ",
               st.pairs);
    double kl = 0;
    for (int64_t k = 0; k < st.pairs; ++k) kl += pi[size_t(2 * k + 1)] - refp(size_t(2 * k + 1));
    kl = std::max(0.0, kl / double(std::max<int64_t>(1, st.pairs)));
    st.kl = kl * double(st.pairs);
    for (int64_t k = 0; k < st.pairs; ++k) {
      const size_t q = size_t(2 * k);
      const bool good = labels[size_t(k)] != 0;
      const KtoTerm t = kto_term(pi[q], refp(q), kl, good, o);
      st.loss += t.loss;
      (good ? st.reward_chosen : st.reward_rejected) += t.reward;
      st.desirable += good;
      st.correct += good ? t.reward > 0 : t.reward < 0;
      (*weight)[q] = -t.d_pi / double(pairs_in_step);
    }
    return st;
  }
  for (int64_t k = 0; k < st.pairs; ++k) {
    const size_t c = size_t(2 * k), r = c + 1;
    PairLogps x;
    x.pi_c = pi[c], x.pi_r = pi[r];
    x.ref_c = refp(c), x.ref_r = refp(r);
    x.n_c = n[c], x.n_r = n[r];
    const DpoPair p = dpo_pair(x, o);
    st.loss += p.loss;
    st.reward_chosen += p.reward_chosen;
    st.reward_rejected += p.reward_rejected;
    st.correct += p.reward_chosen > p.reward_rejected;
    // The model's loss is sum_i w_i (-log p_i), whose gradient is -sum_i w_i d log p_i; the
    // DPO gradient is sum_s dL/dpi_s d pi_s with pi_s = sum_{i in s} log p_i: w_i = -dL/dpi_s.
    (*weight)[c] = -p.d_chosen / double(pairs_in_step);
    (*weight)[r] = -p.d_rejected / double(pairs_in_step);
  }
  const double nll_w = nll_weight(o);
  int64_t chosen_tokens = 0;
  for (int64_t k = 0; k < st.pairs; ++k) chosen_tokens += n[size_t(2 * k)];
  if (nll_w > 0 && chosen_tokens > 0) {
    // The step's loss is the mean over pairs of the pair terms plus the mean over micro-
    // batches of each one's NLL (TRL's cross-entropy over its chosen reply tokens):
    // pairs_in_step / pairs micro-batches.
    const double micro_batches = double(pairs_in_step) / double(std::max<int64_t>(1, st.pairs));
    double nll = 0;
    for (int64_t k = 0; k < st.pairs; ++k) {
      nll -= pi[size_t(2 * k)];
      (*weight)[size_t(2 * k)] += nll_w / (double(chosen_tokens) * micro_batches);
    }
    nll /= double(chosen_tokens);
    st.nll = nll * double(st.pairs);
    st.loss += nll_w * nll * double(st.pairs);
  }
  return st;
}

// A micro-batch's pairs (sequences 2k and 2k+1 of `in`) from the policy's and the reference's
// sequence log-probabilities: their losses and statistics (sequence_terms), and in `w` each
// token's loss weight for the backward. The reply token counts and KTO's labels come from the
// whole micro-batch `b` (under CP `in` holds this rank's chunks of its sequences).
DpoRecipe::Stats DpoRecipe::terms(const Batch& b, const ModelInput& in, const StepOutputs& ref,
                                  const StepOutputs& pol, int64_t pairs_in_step,
                                  std::vector<float>& w) const {
  std::vector<int64_t> n(size_t(in.nseq), 0);  // reply tokens of each sequence
  for (int q = 0; q < in.nseq; ++q)
    for (int i = b.cu_seqlens[q]; i < b.cu_seqlens[q + 1]; ++i) n[size_t(q)] += b.targets[i] >= 0;
  std::vector<double> seq_w;
  const Stats st =
      sequence_terms(opt_, pol.seq_logprobs, ref.seq_logprobs, n, b.labels, pairs_in_step, &seq_w);
  w.assign(size_t(in.N), 0.f);
  for (int q = 0; q < in.nseq; ++q)
    for (int i = in.cu_seqlens[q]; i < in.cu_seqlens[q + 1]; ++i)
      w[size_t(i)] = static_cast<float>(seq_w[size_t(q)]);
  return st;
}

// DPO over a pipeline: the step's micro-batches run forward only through the reference's
// stages (LoRA: the policy's, adapters detached) and the policy's, the rank holding the last
// stage turns the sequence log-probabilities into the DPO terms and per-token weights (the
// weights matter only to the head, which is there), and then one pipeline schedule runs the
// policy's forwards and backwards with those weights. The figures live on the last stage:
// summed over the pipeline (the other stages hold zeros). With `backward`, gradients
// accumulate with the weights scaled by 1 / pairs_in_step.
DpoRecipe::Stats DpoRecipe::pipeline(std::vector<Batch>& batches, bool backward,
                                     int64_t pairs_in_step) {
  std::vector<ModelInput> in;
  for (const Batch& b : batches) in.push_back(b.input());
  std::vector<StepOutputs> ref, pol;
  if (!uses_reference(opt_.loss)) {
    ref.resize(in.size());  // SimPO, ORPO: no reference pass
  } else if (s_.lora) {
    s_.lora->set_attached(false);
    s_.pipe->forward_only(in, &ref);
    s_.lora->set_attached(true);
  } else {
    s_.reference.pipe->forward_only(in, &ref);
  }
  // The policy's forward-only passes and the training schedule draw the same dropout masks.
  LoraDropoutScope drop(backward ? s_.lora.get() : nullptr, 0);
  if (backward && s_.lora)
    s_.pipe->before_micro = [this](int mb) {
      s_.lora->set_dropout_batch(s_.global_micro(step_, size_t(mb)));
    };
  struct Unhook {
    parallel::PipelineRunner& p;
    ~Unhook() { p.before_micro = nullptr; }
  } unhook{*s_.pipe};
  s_.pipe->forward_only(in, &pol);
  Stats total;
  std::vector<std::vector<float>> w(in.size());
  if (s_.model->pipeline_stage().last)
    for (size_t j = 0; j < in.size(); ++j) {
      total += terms(batches[j], in[j], ref[j], pol[j], pairs_in_step, w[j]);
      in[j].loss_weights = w[j].data();
    }
  if (backward) {
    for (ModelInput& x : in) x.aux_weight = aux_weight(x);
    s_.pipe->run(in, 1.f);
  }
  total.all_reduce(s_.pg->pp());
  return total;
}

}  // namespace loom
