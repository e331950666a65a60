#include "model/moe_layer.h"

#include <algorithm>
#include <cmath>

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
  H_ = cfg.fc_dim() / ep.tp_size;  // w1's output: [gate | up] for SwiGLU
  swiglu_ = cfg.family == Family::Llama;
  sigmoid_ = cfg.moe_router == "sigmoid";
  if (ep.make_exchange)
    xchg_ = ep.make_exchange(ep, be_, E_, C_);
  else if (ep.size == 1 && ep.tp_size == 1)
    xchg_ = local_expert_exchange(be_, E_, C_);
  else
    xchg_ = refusing_expert_exchange(
        "an expert-parallel layout built without its communication runs no step: make it with "
        "parallel::expert_parallel_layout");
}

namespace {

size_t sz(int64_t n) {
  return static_cast<size_t>(std::max<int64_t>(n, 1));
}
float* fbuf(BackendBuffer& b, Backend& be, int64_t n) {
  return b.ensure_n<float>(be, sz(n), "moe");
}
int32_t* ibuf(BackendBuffer& b, Backend& be, int64_t n) {
  return b.ensure_n<int32_t>(be, sz(n), "moe");
}
// The plan's row_of [N*k] (token_of follows it: Backend::moe_plan_routing).
int32_t* plan_rows(const BackendBuffer& plan, int E) {
  return plan.as<int32_t>() + 3 * E + 1;
}

}  // namespace

const std::vector<int32_t>& MoeLayer::topk() const {
  topk_host_.resize(size_t(N_) * k_);
  be_.copy_d2h(topk_host_.data(), topk_idx_.data(), topk_host_.size() * sizeof(int32_t));
  return topk_host_;
}

double MoeLayer::forward(float* y, const float* x, int N, const MoeWeights& w) {
  const int C = C_, E = E_, k = k_;
  N_ = N;
  // Router: logits [N, E], then scores and the top-k choice.
  float* logits = fbuf(logits_, be_, int64_t(N) * E);
  be_.matmul_forward(logits, x, w.router, nullptr, N, C, E);
  float* scores = fbuf(scores_, be_, int64_t(N) * E);
  int32_t* idx = ibuf(topk_idx_, be_, int64_t(N) * k);
  float* tw = fbuf(topk_w_, be_, int64_t(N) * k);
  // Top-k weights are renormalised to sum to 1 (Mixtral); with k = 1 the raw score is kept so
  // the router still gets a gradient (Switch).
  be_.moe_router_forward(scores, idx, tw, logits, N, E, k, sigmoid_, k > 1);
  const double aux = aux_loss(nullptr, 0.f);
  // Rows each expert may take: ceil(capacity_factor * N * k / E) (cpu::moe_capacity).
  const int cap =
      cfg_.capacity_factor > 0 ? static_cast<int>(std::ceil(cfg_.capacity_factor * N * k / E)) : -1;
  int32_t* plan = ibuf(plan_, be_, Backend::moe_plan_ints(N, E, k));
  be_.moe_plan_routing(plan, idx, N, E, k, cap);
  // The one host read of the step's routing: assigned and kept rows per expert (2E integers).
  // The grouped GEMMs' sizes and the exchange's plan depend on them.
  std::vector<int32_t> ac(size_t(2 * E));
  be_.copy_d2h(ac.data(), plan, ac.size() * sizeof(int32_t));
  std::vector<int32_t> counts(ac.begin() + E, ac.end()), offsets(size_t(E) + 1, 0);
  stats_.assigned.assign(E, 0);
  stats_.dropped = 0;
  for (int e = 0; e < E; ++e) {
    stats_.assigned[size_t(e)] = ac[size_t(e)];
    stats_.dropped += ac[size_t(e)] - counts[size_t(e)];
    offsets[size_t(e) + 1] = offsets[size_t(e)] + counts[size_t(e)];
  }
  const int rows = rows_ = offsets[size_t(E)];
  float* xp = fbuf(xp_, be_, int64_t(rows) * C);
  be_.moe_permute(xp, x, plan_rows(plan_, E) + int64_t(N) * k, rows, C);
  stats_.a2a_send_elems = xchg_->plan(counts.data(), offsets.data(), local_offsets_);
  const int R = local_offsets_[size_t(El_)];
  float* xe = fbuf(xe_, be_, int64_t(R) * C);
  xchg_->dispatch(xp, xe);
  // The experts' MLPs over their expert-grouped rows (kernels/cpu/moe.h
  // moe_grouped_mlp_forward's order of operations).
  const int H = H_, F = F_;
  float* h = fbuf(h_, be_, int64_t(R) * H);
  float* a = fbuf(a_, be_, int64_t(R) * F);
  float* ye = fbuf(ye_, be_, int64_t(R) * C);
  const int32_t* lo = local_offsets_.data();
  for (int e = 0; e < El_; ++e)
    if (const int n = lo[e + 1] - lo[e]; n > 0)
      be_.matmul_forward(h + int64_t(lo[e]) * H, xe + int64_t(lo[e]) * C, w.w1 + int64_t(e) * H * C,
                         nullptr, n, C, H);
  if (swiglu_)
    be_.swiglu_forward(a, h, R, F);
  else
    be_.gelu_forward(a, h, int64_t(R) * F);
  for (int e = 0; e < El_; ++e)
    if (const int n = lo[e + 1] - lo[e]; n > 0)
      be_.matmul_forward(ye + int64_t(lo[e]) * C, a + int64_t(lo[e]) * F, w.w2 + int64_t(e) * C * F,
                         nullptr, n, F, C);
  // Each expert-tensor-parallel rank holds a slice of the experts' width: its output is a
  // partial sum over the group (row-parallel w2).
  xchg_->reduce_partial(ye, int64_t(R) * C);
  float* yp = fbuf(yp_, be_, int64_t(rows) * C);
  xchg_->combine(ye, yp);
  be_.moe_unpermute(y, yp, tw, plan_rows(plan_, E), N, k, C);
  return aux;
}

void MoeLayer::backward(float* dx, const float* dy, const float* x, int N, const MoeWeights& w,
                        const MoeWeights& g, float aux_dloss) {
  LOOM_CHECK(N == N_, "MoE backward for ", N, " tokens after a forward of ", N_);
  const int C = C_, E = E_, k = k_, rows = rows_, R = local_offsets_[size_t(El_)];
  const int H = H_, F = F_;
  float* dyp = fbuf(dyp_, be_, int64_t(rows) * C);
  float* dtw = fbuf(dtopk_w_, be_, int64_t(N) * k);
  be_.moe_unpermute_backward(dyp, dtw, dy, yp_.as<float>(), topk_w_.as<float>(),
                             plan_rows(plan_, E), N, k, C);
  float* dye = fbuf(dye_, be_, int64_t(R) * C);
  xchg_->dispatch(dyp, dye);
  // The experts' backward (moe_grouped_mlp_backward's order): w2, the activation, w1.
  float* dxe = fbuf(dxe_, be_, int64_t(R) * C);
  float* da = fbuf(da_, be_, int64_t(R) * F);
  float* dh = fbuf(dh_, be_, int64_t(R) * H);
  const float *xe = xe_.as<float>(), *h = h_.as<float>(), *a = a_.as<float>();
  const int32_t* lo = local_offsets_.data();
  for (int e = 0; e < El_; ++e)
    if (const int n = lo[e + 1] - lo[e]; n > 0)
      be_.matmul_backward(da + int64_t(lo[e]) * F, g.w2 ? g.w2 + int64_t(e) * C * F : nullptr,
                          nullptr, dye + int64_t(lo[e]) * C, a + int64_t(lo[e]) * F,
                          w.w2 + int64_t(e) * C * F, n, F, C);
  if (swiglu_)
    be_.swiglu_backward(dh, h, da, R, F);
  else
    be_.gelu_backward(dh, h, da, int64_t(R) * F);
  for (int e = 0; e < El_; ++e)
    if (const int n = lo[e + 1] - lo[e]; n > 0)
      be_.matmul_backward(dxe + int64_t(lo[e]) * C, g.w1 ? g.w1 + int64_t(e) * H * C : nullptr,
                          nullptr, dh + int64_t(lo[e]) * H, xe + int64_t(lo[e]) * C,
                          w.w1 + int64_t(e) * H * C, n, C, H);
  // Column-parallel w1 under ETP: the input gradient is a partial sum.
  xchg_->reduce_partial(dxe, int64_t(R) * C);
  float* dxp = fbuf(dxp_, be_, int64_t(rows) * C);
  xchg_->combine(dxe, dxp);
  be_.moe_permute_backward(dx, dxp, plan_rows(plan_, E), N, k, C);
  // Router: the top-k weights' gradient plus the auxiliary loss's gradient on the scores.
  float* dscores = fbuf(dscores_, be_, int64_t(N) * E);
  be_.fill_bytes(dscores, 0, sizeof(float) * size_t(N) * E);
  aux_loss(dscores, aux_dloss);
  float* dlogits = fbuf(dlogits_, be_, int64_t(N) * E);
  be_.moe_router_backward(dlogits, dtw, dscores, scores_.as<float>(), topk_idx_.as<int32_t>(), N, E,
                          k, sigmoid_, k > 1);
  float* dxr = fbuf(dxr_, be_, int64_t(N) * C);
  be_.matmul_backward(dxr, g.router, nullptr, dlogits, x, w.router, N, C, E);
  be_.add_inplace(dx, dxr, int64_t(N) * C);
}

double MoeLayer::aux_loss(float* dscores, float aux_dloss) {
  const int N = N_, E = E_, k = k_;
  const float coeff = static_cast<float>(cfg_.aux_loss_coeff);
  const float* scores = scores_.as<float>();
  const int32_t* idx = topk_idx_.as<int32_t>();
  if (!token_group_ || token_group_->size() == 1)
    return be_.moe_aux_loss(dscores, scores, idx, N, E, k, coeff, aux_dloss);
  if (dscores) {
    // d(aux)/d(score[t, e]) = coeff * E * f_e / N_group for every token of the group; the
    // objective weights the micro-batch's aux loss by its N_group tokens and the decoder passes
    // aux_dloss = dloss * N (this rank's tokens), so each local score gets
    // aux_dloss * coeff * E * f_e / N, as in the single-process kernel with the group's f_e.
    if (N == 0) return 0.0;
    std::vector<float> row(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e)
      row[size_t(e)] = static_cast<float>(double(aux_dloss) * coeff * E * group_f_[size_t(e)] / N);
    float* grow = fbuf(group_buf_, be_, 2 * E + 1);
    be_.copy_h2d(grow, row.data(), row.size() * sizeof(float));
    be_.add_row_broadcast(dscores, grow, N, E);
    return 0.0;
  }
  // One all-reduce of [assigned per expert, score sum per expert, tokens] over the group (on
  // the device), then those 2E + 1 numbers to the host to form the loss.
  float* dev = fbuf(group_buf_, be_, 2 * E + 1);
  be_.moe_expert_stats(dev, scores, idx, N, E, k);
  token_group_->all_reduce(dev, 2 * E + 1, DType::F32, comm::ReduceOp::Sum);
  std::vector<float> buf(size_t(2 * E + 1));
  be_.copy_d2h(buf.data(), dev, buf.size() * sizeof(float));
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
