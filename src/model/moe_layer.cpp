#include "model/moe_layer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace loom {

void ExpertParallel::validate(const ModelConfig& c) const {
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size, "expert-parallel rank ", rank,
             " outside a group of ", size);
  LOOM_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "expert-tensor-parallel rank ",
             tp_rank, " outside a group of ", tp_size);
  if (tp_size > 1) {
    LOOM_CHECK(c.is_moe(), "parallel.etp = ", tp_size, " needs a mixture-of-experts model ",
               "(model.n_experts > 0)");
    LOOM_CHECK(c.d_ff % tp_size == 0, "model.d_ff (", c.d_ff,
               ") is the expert FFN width and must be divisible by parallel.etp (", tp_size,
               "): use an etp that divides it");
    LOOM_CHECK(tp_comm && tp_comm->size() == tp_size,
               "expert tensor parallelism needs its group's communicator");
  }
  if (size == 1) return;
  LOOM_CHECK(c.is_moe(), "parallel.ep = ", size, " needs a mixture-of-experts model ",
             "(model.n_experts > 0)");
  LOOM_CHECK(c.n_experts % size == 0, "model.n_experts (", c.n_experts,
             ") must be divisible by parallel.ep (", size, "): use an ep that divides it");
  LOOM_CHECK(comm && comm->size() == size, "expert parallelism needs its group's communicator");
}

MoeLayer::MoeLayer(const ModelConfig& cfg, const ExpertParallel& ep, Backend& backend)
    : cfg_(cfg), ep_(ep), be_(backend) {
  C_ = cfg.d_model;
  E_ = cfg.n_experts;
  El_ = E_ / ep.size;
  k_ = cfg.top_k;
  F_ = cfg.d_ff / ep.tp_size;
  H_ = cfg.fc_dim() / ep.tp_size;
  score_ = cfg.moe_router == "sigmoid" ? cpu::RouterScore::Sigmoid : cpu::RouterScore::Softmax;
  act_ = cfg.family == Family::Llama ? cpu::MoeActivation::SwiGLU : cpu::MoeActivation::GeLU;
  if (ep.make_exchange)
    xchg_ = ep.make_exchange(ep, E_, C_);
  else if (ep.size == 1 && ep.tp_size == 1)
    xchg_ = local_expert_exchange(E_, C_);
  else
    xchg_ = refusing_expert_exchange(
        "an expert-parallel layout built without its communication runs no step: make it with "
        "parallel::expert_parallel_layout");
}

static size_t sz(int64_t n) {
  return static_cast<size_t>(std::max<int64_t>(n, 1));
}

double MoeLayer::forward(float* y, const float* x, int N, const MoeWeights& w) {
  const int C = C_, E = E_, k = k_;
  N_ = N;
  // Router: logits [N, E] (kept in scores_ until the scores overwrite them).
  std::vector<float> logits(size_t(N) * E);
  be_.matmul_forward(logits.data(), x, w.router, nullptr, N, C, E);
  scores_.resize(size_t(N) * E);
  topk_idx_.resize(size_t(N) * k);
  topk_w_.resize(size_t(N) * k);
  // Top-k weights are renormalised to sum to 1 (Mixtral); with k = 1 the raw score is kept so
  // the router still gets a gradient (Switch).
  cpu::moe_router_forward(scores_.data(), topk_idx_.data(), topk_w_.data(), logits.data(), N, E, k,
                          score_, k > 1);
  const double aux = aux_loss(nullptr, 0.f);
  const int cap = cfg_.capacity_factor > 0 ? cpu::moe_capacity(N, E, k, cfg_.capacity_factor) : -1;
  routing_ = cpu::moe_plan_routing(topk_idx_.data(), N, E, k, cap);
  stats_.assigned.assign(E, 0);
  for (size_t i = 0; i < topk_idx_.size(); ++i) ++stats_.assigned[topk_idx_[i]];
  stats_.dropped = routing_.dropped;
  const int rows = routing_.rows();
  xp_.resize(sz(int64_t(rows) * C));
  cpu::moe_permute(xp_.data(), x, routing_, C);
  stats_.a2a_send_elems =
      xchg_->plan(routing_.counts.data(), routing_.offsets.data(), local_offsets_);
  const int R = local_offsets_[El_];
  xe_.resize(sz(int64_t(R) * C));
  xchg_->dispatch(xp_.data(), xe_.data());
  h_.resize(sz(int64_t(R) * H_));
  a_.resize(sz(int64_t(R) * F_));
  ye_.resize(sz(int64_t(R) * C));
  cpu::moe_grouped_mlp_forward(ye_.data(), h_.data(), a_.data(), xe_.data(), w.w1, w.w2,
                               local_offsets_.data(), El_, C, F_, act_);
  // Each expert-tensor-parallel rank holds a slice of the experts' width: its output is a
  // partial sum over the group (row-parallel w2).
  xchg_->reduce_partial(ye_.data(), int64_t(R) * C);
  yp_.resize(sz(int64_t(rows) * C));
  xchg_->combine(ye_.data(), yp_.data());
  cpu::moe_unpermute(y, yp_.data(), topk_w_.data(), routing_, C);
  return aux;
}

void MoeLayer::backward(float* dx, const float* dy, const float* x, int N, const MoeWeights& w,
                        const MoeWeights& g, float aux_dloss) {
  LOOM_CHECK(N == N_, "MoE backward for ", N, " tokens after a forward of ", N_);
  const int C = C_, E = E_, k = k_, rows = routing_.rows(), R = local_offsets_[El_];
  dyp_.resize(sz(int64_t(rows) * C));
  dtopk_w_.resize(size_t(N) * k);
  cpu::moe_unpermute_backward(dyp_.data(), dtopk_w_.data(), dy, yp_.data(), topk_w_.data(),
                              routing_, C);
  dye_.resize(sz(int64_t(R) * C));
  xchg_->dispatch(dyp_.data(), dye_.data());
  dxe_.resize(sz(int64_t(R) * C));
  scratch_.resize(sz(int64_t(R) * (F_ + H_)));
  cpu::moe_grouped_mlp_backward(dxe_.data(), g.w1, g.w2, scratch_.data(), dye_.data(), xe_.data(),
                                h_.data(), a_.data(), w.w1, w.w2, local_offsets_.data(), El_, C, F_,
                                act_);
  // Column-parallel w1 under ETP: the input gradient is a partial sum.
  xchg_->reduce_partial(dxe_.data(), int64_t(R) * C);
  dxp_.resize(sz(int64_t(rows) * C));
  xchg_->combine(dxe_.data(), dxp_.data());
  cpu::moe_permute_backward(dx, dxp_.data(), routing_, C);
  // Router: the top-k weights' gradient plus the auxiliary loss's gradient on the scores.
  dscores_.assign(size_t(N) * E, 0.f);
  aux_loss(dscores_.data(), aux_dloss);
  dlogits_.resize(size_t(N) * E);
  cpu::moe_router_backward(dlogits_.data(), dtopk_w_.data(), dscores_.data(), scores_.data(),
                           topk_idx_.data(), N, E, k, score_, k > 1);
  dxr_.resize(size_t(N) * C);
  be_.matmul_backward(dxr_.data(), g.router, nullptr, dlogits_.data(), x, w.router, N, C, E);
  be_.add_inplace(dx, dxr_.data(), int64_t(N) * C);
}

double MoeLayer::aux_loss(float* dscores, float aux_dloss) {
  const int N = N_, E = E_, k = k_;
  const float coeff = static_cast<float>(cfg_.aux_loss_coeff);
  if (!token_group_ || token_group_->size() == 1)
    return cpu::moe_aux_loss(dscores, scores_.data(), topk_idx_.data(), N, E, k, coeff, aux_dloss);
  if (dscores) {
    // d(aux)/d(score[t, e]) = coeff * E * f_e / N_group for every token of the group; the
    // objective weights the micro-batch's aux loss by its N_group tokens and the decoder passes
    // aux_dloss = dloss * N (this rank's tokens), so each local score gets
    // aux_dloss * coeff * E * f_e / N, as in the single-process kernel with the group's f_e.
    if (N == 0) return 0.0;
    for (int t = 0; t < N; ++t)
      for (int e = 0; e < E; ++e)
        dscores[size_t(t) * E + e] +=
            static_cast<float>(double(aux_dloss) * coeff * E * group_f_[size_t(e)] / N);
    return 0.0;
  }
  // One all-reduce of [assigned per expert, score sum per expert, tokens] over the group:
  // counts are exact in fp32 at these sizes; the score sums are accumulated in double locally.
  std::vector<double> score_sum(E, 0.0);
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e) score_sum[size_t(e)] += scores_[size_t(t) * E + e];
  std::vector<float> buf(size_t(2 * E + 1), 0.f);
  for (size_t i = 0; i < topk_idx_.size(); ++i) buf[size_t(topk_idx_[i])] += 1.f;
  for (int e = 0; e < E; ++e) buf[size_t(E + e)] = static_cast<float>(score_sum[size_t(e)]);
  buf[size_t(2 * E)] = static_cast<float>(N);
  token_group_->all_reduce(buf.data(), int64_t(buf.size()), DType::F32, comm::ReduceOp::Sum);
  const double n_group = buf[size_t(2 * E)];
  group_f_.assign(size_t(E), 0.0);
  if (n_group == 0) return 0.0;
  double loss = 0.0;
  for (int e = 0; e < E; ++e) {
    group_f_[size_t(e)] = buf[size_t(e)] / (n_group * k);
    loss += group_f_[size_t(e)] * (buf[size_t(E + e)] / n_group);
  }
  return double(coeff) * E * loss;
}

}  // namespace loom
