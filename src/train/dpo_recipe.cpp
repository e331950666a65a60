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
  return o;
}

DpoRecipe::Stats& DpoRecipe::Stats::operator+=(const Stats& o) {
  loss += o.loss;
  reward_chosen += o.reward_chosen;
  reward_rejected += o.reward_rejected;
  correct += o.correct;
  pairs += o.pairs;
  return *this;
}

void DpoRecipe::Stats::all_reduce(comm::Communicator& g) {
  loss = g.all_reduce_scalar(loss, comm::ReduceOp::Sum);
  reward_chosen = g.all_reduce_scalar(reward_chosen, comm::ReduceOp::Sum);
  reward_rejected = g.all_reduce_scalar(reward_rejected, comm::ReduceOp::Sum);
  correct = g.all_reduce_scalar(correct, comm::ReduceOp::Sum);
  pairs = g.all_reduce_scalar(pairs, comm::ReduceOp::Sum);
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
  if (s_.lora) {
    s_.lora->set_attached(false);
    s_.model->forward_loss(in, &ref);
    s_.lora->set_attached(true);
  } else {
    s_.reference.model->forward_loss(in, &ref);
  }
  s_.model->forward_loss(in, &pol);
  std::vector<float> w;
  const Stats st = terms(in, ref, pol, pairs_in_step, w);
  if (backward) {
    in.loss_weights = w.data();
    in.aux_weight = aux_weight(in);
    s_.model->forward_backward(in, 1.f);
  }
  return st;
}

// A micro-batch's pairs (sequences 2k and 2k+1 of `in`) from the policy's and the reference's
// sequence log-probabilities: their DPO losses and statistics, and in `w` each token's loss
// weight for the backward (dL/dpi of its sequence, over the step's pairs).
DpoRecipe::Stats DpoRecipe::terms(const ModelInput& in, const StepOutputs& ref,
                                  const StepOutputs& pol, int64_t pairs_in_step,
                                  std::vector<float>& w) const {
  Stats st;
  st.pairs = in.nseq / 2;
  w.assign(size_t(in.N), 0.f);
  for (int64_t k = 0; k < st.pairs; ++k) {
    const size_t c = size_t(2 * k), r = c + 1;
    const DpoPair p = dpo_pair(pol.seq_logprobs[c], pol.seq_logprobs[r], ref.seq_logprobs[c],
                               ref.seq_logprobs[r], opt_.beta, opt_.loss);
    st.loss += p.loss;
    st.reward_chosen += p.reward_chosen;
    st.reward_rejected += p.reward_rejected;
    st.correct += p.reward_chosen > p.reward_rejected;
    // The model's loss is sum_i w_i (-log p_i), whose gradient is -sum_i w_i d log p_i; the
    // DPO gradient is sum_s dL/dpi_s d pi_s with pi_s = sum_{i in s} log p_i: w_i = -dL/dpi_s.
    const double d[2] = {p.d_chosen, p.d_rejected};
    for (int s = 0; s < 2; ++s)
      for (int i = in.cu_seqlens[c + s]; i < in.cu_seqlens[c + s + 1]; ++i)
        w[size_t(i)] = static_cast<float>(-d[s] / double(pairs_in_step));
  }
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
  if (s_.lora) {
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
      total += terms(in[j], ref[j], pol[j], pairs_in_step, w[j]);
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
