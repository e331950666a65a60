#include "train/reward_recipe.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom {

RewardRecipe::RewardRecipe(TrainSetup& s) : s_(s) {
  LOOM_CHECK(s_.model->config().value_head, "train.mode = \"reward\" needs model.value_head");
  LOOM_CHECK(!s_.lora, "train.mode = \"reward\" trains the whole model and its value head: ",
             "LoRA (lora.rank) is not supported for reward models");
}

RewardRecipe::Stats& RewardRecipe::Stats::operator+=(const Stats& o) {
  loss += o.loss;
  reward_chosen += o.reward_chosen;
  reward_rejected += o.reward_rejected;
  correct += o.correct;
  pairs += o.pairs;
  return *this;
}

void RewardRecipe::Stats::all_reduce(comm::Communicator& g) {
  loss = g.all_reduce_scalar(loss, comm::ReduceOp::Sum);
  reward_chosen = g.all_reduce_scalar(reward_chosen, comm::ReduceOp::Sum);
  reward_rejected = g.all_reduce_scalar(reward_rejected, comm::ReduceOp::Sum);
  correct = g.all_reduce_scalar(correct, comm::ReduceOp::Sum);
  pairs = g.all_reduce_scalar(pairs, comm::ReduceOp::Sum);
}

std::vector<std::pair<std::string, double>> RewardRecipe::Stats::report(
    const std::string& pre) const {
  const double n = double(std::max<int64_t>(1, pairs));
  return {{pre + "rewards_chosen", reward_chosen / n},
          {pre + "rewards_rejected", reward_rejected / n},
          {pre + "reward_margin", (reward_chosen - reward_rejected) / n},
          {pre + "reward_accuracy", correct / n}};
}

std::vector<int32_t> last_token_rows(const Batch& b) {
  const int nseq = static_cast<int>(b.cu_seqlens.size()) - 1;
  std::vector<int32_t> rows(size_t(std::max(0, nseq)));
  for (int q = 0; q < nseq; ++q) {
    const int len =
        q < int(b.lengths.size()) ? b.lengths[size_t(q)] : b.cu_seqlens[q + 1] - b.cu_seqlens[q];
    rows[size_t(q)] = b.cu_seqlens[q] + std::max(0, len - 1);
  }
  return rows;
}

RewardRecipe::Stats RewardRecipe::pair_terms(const std::vector<double>& r, int64_t pairs_in_step,
                                             std::vector<float>* grad) {
  Stats st;
  st.pairs = int64_t(r.size()) / 2;
  grad->assign(r.size(), 0.f);
  for (int64_t k = 0; k < st.pairs; ++k) {
    const double d = r[size_t(2 * k)] - r[size_t(2 * k + 1)];
    // -log sigmoid(d) = log(1 + exp(-d)), without overflow either way.
    st.loss += d > 0 ? std::log1p(std::exp(-d)) : -d + std::log1p(std::exp(d));
    const double s = d >= 0 ? std::exp(-d) / (1 + std::exp(-d)) : 1 / (1 + std::exp(d));
    (*grad)[size_t(2 * k)] = static_cast<float>(-s / double(pairs_in_step));  // sigmoid(-d)
    (*grad)[size_t(2 * k + 1)] = static_cast<float>(s / double(pairs_in_step));
    st.reward_chosen += r[size_t(2 * k)];
    st.reward_rejected += r[size_t(2 * k + 1)];
    st.correct += d > 0;
  }
  return st;
}

RewardRecipe::Stats RewardRecipe::micro(const Batch& b, bool backward, int64_t pairs_in_step) {
  ModelInput in = b.input();
  const std::vector<int32_t> rows = last_token_rows(b);
  in.value_rows = rows.data();
  in.n_values = static_cast<int>(rows.size());
  StepOutputs out;
  s_.model->forward_loss(in, &out);
  std::vector<float> g;
  const Stats st = pair_terms(out.values, pairs_in_step, &g);
  if (backward) {
    in.value_grads = g.data();
    s_.model->forward_backward(in, 1.f);
  }
  return st;
}

RewardRecipe::Stats RewardRecipe::gradients(std::vector<Batch>& micro_batches, BatchSource& data,
                                            int64_t) {
  const int64_t pairs = int64_t(s_.opt.micro_batch) * s_.opt.grad_accum * s_.pg->dp().size();
  Stats total;
  s_.engine->accumulate(static_cast<int>(micro_batches.size()), [&](int j) {
    Batch& b = micro_batches[size_t(j)];
    data.next(b);
    total += micro(b, true, pairs);
  });
  total.all_reduce(s_.pg->dp());
  return total;
}

RewardRecipe::Stats RewardRecipe::evaluate(BatchSource& valid, int batches) {
  Stats total;
  Batch b;
  for (int i = 0; i < batches; ++i) {
    valid.next(b);
    total += micro(b, false, 1);
  }
  return total;
}

}  // namespace loom
