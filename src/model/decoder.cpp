#include "model/decoder.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom {

Recompute recompute_from_name(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  fail("recompute must be none, selective or full, got '", s, "'");
}

const char* recompute_name(Recompute r) {
  return r == Recompute::None ? "none" : r == Recompute::Selective ? "selective" : "full";
}

Decoder::Decoder(const ModelConfig& cfg, Backend& backend, Recompute recompute, DType act_dtype)
    : cfg_(cfg), be_(backend), recompute_(recompute), act_dtype_(act_dtype) {
  cfg_.validate();
  LOOM_CHECK(act_dtype == DType::F32 || act_dtype == DType::BF16 || act_dtype == DType::F16,
             "activation dtype must be fp32, bf16 or fp16, got ", dtype_name(act_dtype));
  build_params();
}

void Decoder::build_params() {
  const int64_t C = cfg_.d_model, V = cfg_.vocab;
  const float std = cfg_.init_std;
  // Output projections of residual branches are scaled by 1/sqrt(2 * layers) (GPT-2) so the
  // residual stream's variance does not grow with depth.
  const float proj_std = std / std::sqrt(2.f * cfg_.n_layer);
  const bool b = cfg_.bias;
  auto norm = [&](const std::string& n) {
    params_.add(n + ".weight", {C}, false, ParamInit::Ones);
    if (b) params_.add(n + ".bias", {C}, false, ParamInit::Zeros);
  };
  auto linear = [&](const std::string& n, int64_t out, int64_t in, float s) {
    params_.add(n + ".weight", {out, in}, true, ParamInit::Normal, s);
    if (b) params_.add(n + ".bias", {out}, false, ParamInit::Zeros);
  };
  params_.add("embed.wte", {V, C}, false, ParamInit::Normal, std);
  if (cfg_.uses_positions_table())
    params_.add("embed.wpe", {cfg_.max_seq, C}, false, ParamInit::Normal, std);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    std::string p = "blocks." + std::to_string(l);
    norm(p + ".norm1");
    linear(p + ".attn.qkv", cfg_.qkv_dim(), C, std);
    linear(p + ".attn.proj", C, static_cast<int64_t>(cfg_.n_head) * cfg_.head_dim, proj_std);
    norm(p + ".norm2");
    linear(p + ".mlp.fc", cfg_.fc_dim(), C, std);
    linear(p + ".mlp.proj", C, cfg_.d_ff, proj_std);
  }
  norm("final_norm");
  if (!cfg_.tied) params_.add("head.weight", {V, C}, true, ParamInit::Normal, std);
  params_.allocate();
}

Decoder::LayerParams Decoder::layer_params(int l, bool grads) {
  std::string p = "blocks." + std::to_string(l) + ".";
  auto get = [&](const std::string& n) -> float* {
    if (!params_.has(p + n)) return nullptr;
    return grads ? params_.grad_ptr(p + n) : params_.ptr(p + n);
  };
  return {get("norm1.weight"), get("norm1.bias"), get("attn.qkv.weight"), get("attn.qkv.bias"),
          get("attn.proj.weight"), get("attn.proj.bias"), get("norm2.weight"), get("norm2.bias"),
          get("mlp.fc.weight"), get("mlp.fc.bias"), get("mlp.proj.weight"), get("mlp.proj.bias")};
}

void Decoder::ensure_buffers(int N) {
  if (N <= N_) return;
  const int64_t C = cfg_.d_model, Q = cfg_.qkv_dim(), A = int64_t(cfg_.n_head) * cfg_.head_dim,
                H = cfg_.n_head, F = cfg_.d_ff, FC = cfg_.fc_dim(), L = cfg_.n_layer;
  // Two passes: the first measures, the second assigns pointers into one arena.
  std::vector<float*> slots;
  int64_t total = 0;
  float* base = nullptr;
  auto take = [&](int64_t per_token) -> float* {
    int64_t n = (per_token * N + 15) / 16 * 16;
    float* p = base ? base + total : nullptr;
    total += n;
    return p;
  };
  for (int pass = 0; pass < 2; ++pass) {
    total = 0;
    acts_.assign(L, LayerActs{});
    LayerActs shared{};
    shared.ln1 = take(C);
    shared.ln1_mean = take(1);
    shared.ln1_rstd = take(1);
    shared.qkv = take(Q);
    shared.att = take(A);
    shared.lse = take(H);
    shared.x_mid = take(C);
    shared.ln2 = take(C);
    shared.ln2_mean = take(1);
    shared.ln2_rstd = take(1);
    shared.fc = take(FC);
    shared.act = take(F);
    for (int l = 0; l < L; ++l) {
      LayerActs& a = acts_[l];
      a = shared;
      a.x_in = take(C);
      if (recompute_ == Recompute::Full) continue;  // everything else is recomputed
      if (l == 0) continue;                         // layer 0 keeps the shared set
      float* att = a.att;
      float* lse = a.lse;
      a.ln1 = take(C);
      a.ln1_mean = take(1);
      a.ln1_rstd = take(1);
      a.qkv = take(Q);
      a.att = take(A);
      a.lse = take(H);
      a.x_mid = take(C);
      a.ln2 = take(C);
      a.ln2_mean = take(1);
      a.ln2_rstd = take(1);
      a.fc = take(FC);
      a.act = take(F);
      if (recompute_ == Recompute::Selective) {  // attention core recomputed: share it
        a.att = att;
        a.lse = lse;
      }
    }
    x_final_ = take(C);
    lnf_ = take(C);
    lnf_mean_ = take(1);
    lnf_rstd_ = take(1);
    losses_ = take(1);
    dres_ = take(C);
    dln_ = take(C);
    dtmp_ = take(C);
    tmp_ = take(C);
    datt_ = take(A);
    dqkv_ = take(Q);
    dfc_ = take(FC);
    dact_ = take(F);
    int64_t logits = (int64_t(kHeadChunk) * cfg_.vocab + 15) / 16 * 16;
    logits_ = base ? base + total : nullptr;
    total += logits;
    if (pass == 0) {
      arena_.assign(static_cast<size_t>(total), 0.f);
      base = arena_.data();
    }
  }
  N_ = N;
}

void Decoder::round_act(float* x, int64_t n) const {
  if (act_dtype_ != DType::F32) round_to(act_dtype_, x, static_cast<size_t>(n));
}

void Decoder::norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                           const float* b, int N) {
  if (cfg_.family == Family::GPT2)
    be_.layernorm_forward(out, mean, rstd, inp, w, b, N, cfg_.d_model, cfg_.norm_eps);
  else
    be_.rmsnorm_forward(out, rstd, inp, w, N, cfg_.d_model, cfg_.norm_eps);
  round_act(out, int64_t(N) * cfg_.d_model);
}

void Decoder::norm_backward(float* dinp, float* dw, float* db, const float* dout,
                            const float* inp, const float* w, const float* mean, const float* rstd,
                            int N) {
  if (cfg_.family == Family::GPT2)
    be_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, cfg_.d_model);
  else
    be_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, cfg_.d_model);
  round_act(dinp, int64_t(N) * cfg_.d_model);
}

void Decoder::embed_forward(const ModelInput& in) {
  const int C = cfg_.d_model;
  float* x = acts_[0].x_in;
  be_.embedding_forward(x, in.tokens, params_.ptr("embed.wte"), in.N, C, false);
  if (cfg_.uses_positions_table())
    be_.embedding_forward(x, in.positions, params_.ptr("embed.wpe"), in.N, C, true);
  round_act(x, int64_t(in.N) * C);
}

void Decoder::embed_backward(const ModelInput& in) {
  const int C = cfg_.d_model;
  be_.embedding_backward(params_.grad_ptr("embed.wte"), dres_, in.tokens, in.N, C);
  if (cfg_.uses_positions_table())
    be_.embedding_backward(params_.grad_ptr("embed.wpe"), dres_, in.positions, in.N, C);
}

void Decoder::attention_core(const ModelInput& in, const LayerActs& a) {
  const int Hq = cfg_.n_head, Hkv = cfg_.n_kv_head, D = cfg_.head_dim, Q = cfg_.qkv_dim();
  const float* q = a.qkv;
  const float* k = a.qkv + Hq * D;
  const float* v = k + Hkv * D;
  be_.attention_forward(a.att, a.lse, q, k, v, Q, in.cu_seqlens, in.nseq, Hq, Hkv, D,
                        1.f / std::sqrt(static_cast<float>(D)));
  round_act(a.att, int64_t(in.N) * Hq * D);
}

void Decoder::block_forward(int l, const ModelInput& in, const LayerActs& a, float* x_out) {
  const int N = in.N, C = cfg_.d_model, Q = cfg_.qkv_dim(), Hq = cfg_.n_head,
            Hkv = cfg_.n_kv_head, D = cfg_.head_dim, A = Hq * D, F = cfg_.d_ff,
            FC = cfg_.fc_dim();
  LayerParams p = layer_params(l, false);
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.x_in, p.ln1_w, p.ln1_b, N);
  be_.matmul_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, Q);
  if (cfg_.uses_rope()) {
    be_.rope_forward(a.qkv, in.positions, N, Hq, D, Q, cfg_.rope_theta);
    be_.rope_forward(a.qkv + A, in.positions, N, Hkv, D, Q, cfg_.rope_theta);
  }
  round_act(a.qkv, int64_t(N) * Q);
  attention_core(in, a);
  be_.matmul_forward(tmp_, a.att, p.proj_w, p.proj_b, N, A, C);
  round_act(tmp_, int64_t(N) * C);
  be_.add(a.x_mid, a.x_in, tmp_, int64_t(N) * C);
  round_act(a.x_mid, int64_t(N) * C);
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.x_mid, p.ln2_w, p.ln2_b, N);
  be_.matmul_forward(a.fc, a.ln2, p.fc_w, p.fc_b, N, C, FC);
  round_act(a.fc, int64_t(N) * FC);
  if (cfg_.family == Family::GPT2)
    be_.gelu_forward(a.act, a.fc, int64_t(N) * F);
  else
    be_.swiglu_forward(a.act, a.fc, N, F);
  round_act(a.act, int64_t(N) * F);
  if (!x_out) return;  // recomputation needs the layer's internals, not its output
  be_.matmul_forward(tmp_, a.act, p.mp_w, p.mp_b, N, F, C);
  round_act(tmp_, int64_t(N) * C);
  be_.add(x_out, a.x_mid, tmp_, int64_t(N) * C);
  round_act(x_out, int64_t(N) * C);
}

void Decoder::block_backward(int l, const ModelInput& in, const LayerActs& a, float* dres) {
  const int N = in.N, C = cfg_.d_model, Q = cfg_.qkv_dim(), Hq = cfg_.n_head,
            Hkv = cfg_.n_kv_head, D = cfg_.head_dim, A = Hq * D, F = cfg_.d_ff,
            FC = cfg_.fc_dim();
  LayerParams p = layer_params(l, false);
  LayerParams g = layer_params(l, true);
  // MLP branch: x_out = x_mid + act * mp_w^T + mp_b.
  be_.matmul_backward(dact_, g.mp_w, g.mp_b, dres, a.act, p.mp_w, N, F, C);
  round_act(dact_, int64_t(N) * F);
  if (cfg_.family == Family::GPT2)
    be_.gelu_backward(dfc_, a.fc, dact_, int64_t(N) * F);
  else
    be_.swiglu_backward(dfc_, a.fc, dact_, N, F);
  round_act(dfc_, int64_t(N) * FC);
  be_.matmul_backward(dln_, g.fc_w, g.fc_b, dfc_, a.ln2, p.fc_w, N, C, FC);
  round_act(dln_, int64_t(N) * C);
  norm_backward(dtmp_, g.ln2_w, g.ln2_b, dln_, a.x_mid, p.ln2_w, a.ln2_mean, a.ln2_rstd, N);
  be_.add_inplace(dres, dtmp_, int64_t(N) * C);
  round_act(dres, int64_t(N) * C);
  // Attention branch: x_mid = x_in + att * proj_w^T + proj_b.
  be_.matmul_backward(datt_, g.proj_w, g.proj_b, dres, a.att, p.proj_w, N, A, C);
  round_act(datt_, int64_t(N) * A);
  const float* q = a.qkv;
  const float* k = q + A;
  const float* v = k + Hkv * D;
  be_.attention_backward(dqkv_, dqkv_ + A, dqkv_ + A + Hkv * D, datt_, q, k, v, a.att, a.lse, Q,
                         in.cu_seqlens, in.nseq, Hq, Hkv, D,
                         1.f / std::sqrt(static_cast<float>(D)));
  if (cfg_.uses_rope()) {
    be_.rope_backward(dqkv_, in.positions, N, Hq, D, Q, cfg_.rope_theta);
    be_.rope_backward(dqkv_ + A, in.positions, N, Hkv, D, Q, cfg_.rope_theta);
  }
  round_act(dqkv_, int64_t(N) * Q);
  be_.matmul_backward(dln_, g.qkv_w, g.qkv_b, dqkv_, a.ln1, p.qkv_w, N, C, Q);
  round_act(dln_, int64_t(N) * C);
  norm_backward(dtmp_, g.ln1_w, g.ln1_b, dln_, a.x_in, p.ln1_w, a.ln1_mean, a.ln1_rstd, N);
  be_.add_inplace(dres, dtmp_, int64_t(N) * C);
  round_act(dres, int64_t(N) * C);
}

const float* Decoder::head_weight() {
  return cfg_.tied ? params_.ptr("embed.wte") : params_.ptr("head.weight");
}
float* Decoder::head_grad() {
  return cfg_.tied ? params_.grad_ptr("embed.wte") : params_.grad_ptr("head.weight");
}

double Decoder::head(const ModelInput& in, float dloss, bool grads) {
  const int N = in.N, C = cfg_.d_model, V = cfg_.vocab;
  const float* lnf_b = cfg_.bias ? params_.ptr("final_norm.bias") : nullptr;
  norm_forward(lnf_, lnf_mean_, lnf_rstd_, x_final_, params_.ptr("final_norm.weight"), lnf_b, N);
  const float* W = head_weight();
  // Logits exist for kHeadChunk rows at a time: computed, turned into loss and gradient in
  // place, and consumed by the head's backward before the next chunk overwrites them.
  for (int r0 = 0; r0 < N; r0 += kHeadChunk) {
    int n = std::min(kHeadChunk, N - r0);
    be_.matmul_forward(logits_, lnf_ + int64_t(r0) * C, W, nullptr, n, C, V);
    round_act(logits_, int64_t(n) * V);
    be_.cross_entropy(losses_ + r0, grads ? logits_ : nullptr, logits_, in.targets + r0, n, V,
                      dloss);
    if (grads) {
      round_act(logits_, int64_t(n) * V);
      be_.matmul_backward(dln_ + int64_t(r0) * C, head_grad(), nullptr, logits_,
                          lnf_ + int64_t(r0) * C, W, n, C, V);
    }
  }
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += losses_[i];  // fixed order: bit-reproducible
  if (grads) {
    round_act(dln_, int64_t(N) * C);
    float* gb = cfg_.bias ? params_.grad_ptr("final_norm.bias") : nullptr;
    norm_backward(dres_, params_.grad_ptr("final_norm.weight"), gb, dln_, x_final_,
                  params_.ptr("final_norm.weight"), lnf_mean_, lnf_rstd_, N);
  }
  return sum;
}

static void check_input(const ModelInput& in, const ModelConfig& cfg) {
  LOOM_CHECK(in.N > 0 && in.nseq > 0, "empty micro-batch");
  LOOM_CHECK(in.cu_seqlens[0] == 0 && in.cu_seqlens[in.nseq] == in.N,
             "cu_seqlens must start at 0 and end at N=", in.N);
  for (int s = 0; s < in.nseq; ++s)
    LOOM_CHECK(in.cu_seqlens[s + 1] >= in.cu_seqlens[s], "cu_seqlens must be non-decreasing");
  for (int i = 0; i < in.N; ++i) {
    LOOM_CHECK(in.tokens[i] >= 0 && in.tokens[i] < cfg.vocab, "token id ", in.tokens[i],
               " at position ", i, " is outside the vocabulary [0, ", cfg.vocab, ")");
    LOOM_CHECK(in.positions[i] >= 0 && in.positions[i] < cfg.max_seq, "position ",
               in.positions[i], " exceeds model.max_seq ", cfg.max_seq);
    if (in.targets)
      LOOM_CHECK(in.targets[i] >= -1 && in.targets[i] < cfg.vocab, "target id ", in.targets[i],
                 " at position ", i, " is outside the vocabulary");
  }
}

double Decoder::run(const ModelInput& in, float dloss, bool grads) {
  check_input(in, cfg_);
  ensure_buffers(in.N);
  const int L = cfg_.n_layer;
  embed_forward(in);
  for (int l = 0; l < L; ++l)
    block_forward(l, in, acts_[l], l + 1 < L ? acts_[l + 1].x_in : x_final_);
  double loss = head(in, dloss, grads);
  if (!grads) return loss;
  for (int l = L - 1; l >= 0; --l) {
    const LayerActs& a = acts_[l];
    if (recompute_ == Recompute::Full) block_forward(l, in, a, nullptr);
    else if (recompute_ == Recompute::Selective) attention_core(in, a);
    block_backward(l, in, a, dres_);
    if (on_grads_ready) on_grads_ready(l);
  }
  embed_backward(in);
  if (on_grads_ready) on_grads_ready(-1);
  return loss;
}

double Decoder::forward_backward(const ModelInput& in, float dloss) {
  LOOM_CHECK(in.targets, "forward_backward needs targets");
  return run(in, dloss, true);
}

double Decoder::forward_loss(const ModelInput& in) {
  LOOM_CHECK(in.targets, "forward_loss needs targets");
  return run(in, 0.f, false);
}

void Decoder::forward_logits(const ModelInput& in, const std::vector<int>& rows, float* logits) {
  ModelInput fwd = in;
  fwd.targets = nullptr;
  check_input(fwd, cfg_);
  ensure_buffers(in.N);
  const int L = cfg_.n_layer, C = cfg_.d_model, V = cfg_.vocab;
  embed_forward(fwd);
  for (int l = 0; l < L; ++l)
    block_forward(l, fwd, acts_[l], l + 1 < L ? acts_[l + 1].x_in : x_final_);
  const float* lnf_b = cfg_.bias ? params_.ptr("final_norm.bias") : nullptr;
  norm_forward(lnf_, lnf_mean_, lnf_rstd_, x_final_, params_.ptr("final_norm.weight"), lnf_b,
               in.N);
  for (size_t i = 0; i < rows.size(); ++i) {
    LOOM_CHECK(rows[i] >= 0 && rows[i] < in.N, "logit row ", rows[i], " out of range");
    be_.matmul_forward(logits + i * int64_t(V), lnf_ + int64_t(rows[i]) * C, head_weight(),
                       nullptr, 1, C, V);
  }
}

}  // namespace loom
