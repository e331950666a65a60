// One training step (forward + backward) of the decoder, replayed as the same sequence of
// Backend calls that model/decoder.cpp makes (no recompute, fp32 activations), over buffers
// that may live on any device. The Decoder itself keeps its activations in host memory, so it
// cannot drive the CUDA backend yet; this replay lets the GPU tests and the benchmark run the
// real model's op sequence on the GPU.
//
// The replay is checked against the Decoder on the CPU backend (step_replay_test.cpp, runs
// without a GPU): if decoder.cpp changes its op sequence, that test fails and this file must
// follow.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "model/model_config.h"
#include "model/params.h"

namespace loom::test {

class StepReplay {
 public:
  using Alloc = std::function<float*(size_t floats)>;  // zero-filled or not
  using Download = std::function<void(float* dst, const float* src, size_t floats)>;

  // `layout` gives each parameter's offset into the flat `params` / `grads` buffers (which
  // live on the backend's device). Buffers for N tokens come from `alloc`.
  StepReplay(Backend& be, const ModelConfig& cfg, const ParamSet& layout, float* params,
             float* grads, int N, int head_chunk, const Alloc& alloc, Download download)
      : be_(be),
        c_(cfg),
        layout_(layout),
        p_(params),
        g_(grads),
        N_(N),
        chunk_(head_chunk),
        download_(std::move(download)) {
    const int64_t C = c_.d_model, Q = c_.qkv_dim(), A = int64_t(c_.n_head) * c_.head_dim,
                  H = c_.n_head, F = c_.d_ff, FC = c_.fc_dim();
    auto take = [&](int64_t per_token) { return alloc(size_t(per_token * N)); };
    acts_.resize(c_.n_layer);
    for (auto& a : acts_) {
      a.x_in = take(C);
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
    logits_ = alloc(size_t(chunk_) * c_.vocab);
  }

  // Timing hook: called with an op-group name before each group of calls (benchmarks).
  std::function<void(const char*)> mark;

  // The blocks' linear layers through another implementation (the fp8 recipe's), with
  // Backend::matmul_forward / matmul_backward semantics; empty: the backend's. The head stays
  // on the backend, as the recipes keep it.
  struct Linear {
    std::function<void(float* y, const float* x, const float* w, const float* b, int N, int in,
                       int out)>
        forward;
    std::function<void(float* dx, float* dw, float* db, const float* dy, const float* x,
                       const float* w, int N, int in, int out)>
        backward;
  };
  Linear linear;

  // tokens/targets/positions: device arrays of N; cu_seqlens: host array of nseq + 1.
  double forward_backward(const int32_t* tokens, const int32_t* targets, const int32_t* positions,
                          const int32_t* cu_seqlens, int nseq, float dloss) {
    LOOM_CHECK(cu_seqlens[nseq] == N_, "replay: cu_seqlens must end at N");
    in_ = {tokens, targets, positions, cu_seqlens, nseq};
    const int L = c_.n_layer, C = c_.d_model;
    tag("embedding");
    be_.embedding_forward(acts_[0].x_in, tokens, P("embed.wte"), N_, C, false);
    if (c_.uses_positions_table())
      be_.embedding_forward(acts_[0].x_in, positions, P("embed.wpe"), N_, C, true);
    for (int l = 0; l < L; ++l) block_forward(l, l + 1 < L ? acts_[l + 1].x_in : x_final_);
    const double loss = head(dloss);
    for (int l = L - 1; l >= 0; --l) block_backward(l);
    tag("embedding");
    be_.embedding_backward(G("embed.wte"), dres_, tokens, N_, C);
    if (c_.uses_positions_table()) be_.embedding_backward(G("embed.wpe"), dres_, positions, N_, C);
    return loss;
  }

 private:
  struct Acts {
    float *x_in, *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *lse;
    float *x_mid, *ln2, *ln2_mean, *ln2_rstd, *fc, *act;
  };
  struct In {
    const int32_t *tokens, *targets, *positions, *cu;
    int nseq;
  };

  void tag(const char* what) {
    if (mark) mark(what);
  }
  float* P(const std::string& n) const { return p_ + layout_.info(n).offset; }
  float* G(const std::string& n) const { return g_ + layout_.info(n).offset; }
  float* Pl(int l, const std::string& n, bool grad) const {
    const std::string name = "blocks." + std::to_string(l) + "." + n;
    if (!layout_.has(name)) return nullptr;
    return grad ? G(name) : P(name);
  }

  void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                    const float* b) {
    tag("norm");
    if (c_.family == Family::GPT2)
      be_.layernorm_forward(out, mean, rstd, inp, w, b, N_, c_.d_model, c_.norm_eps);
    else
      be_.rmsnorm_forward(out, rstd, inp, w, N_, c_.d_model, c_.norm_eps);
  }
  void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, const float* mean, const float* rstd) {
    tag("norm");
    if (c_.family == Family::GPT2)
      be_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N_, c_.d_model);
    else
      be_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N_, c_.d_model);
  }
  float scale() const { return 1.f / std::sqrt(static_cast<float>(c_.head_dim)); }
  void linear_forward(float* y, const float* x, const float* w, const float* b, int N, int in,
                      int out) {
    if (linear.forward)
      linear.forward(y, x, w, b, N, in, out);
    else
      be_.matmul_forward(y, x, w, b, N, in, out);
  }
  void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                       const float* w, int N, int in, int out) {
    if (linear.backward)
      linear.backward(dx, dw, db, dy, x, w, N, in, out);
    else
      be_.matmul_backward(dx, dw, db, dy, x, w, N, in, out);
  }

  void block_forward(int l, float* x_out) {
    const Acts& a = acts_[l];
    const int N = N_, C = c_.d_model, Q = c_.qkv_dim(), Hq = c_.n_head, Hkv = c_.n_kv_head,
              D = c_.head_dim, A = Hq * D, F = c_.d_ff, FC = c_.fc_dim();
    norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.x_in, Pl(l, "norm1.weight", false),
                 Pl(l, "norm1.bias", false));
    tag("matmul");
    linear_forward(a.qkv, a.ln1, Pl(l, "attn.qkv.weight", false), Pl(l, "attn.qkv.bias", false), N,
                   C, Q);
    if (c_.uses_rope()) {
      tag("rope");
      be_.rope_forward(a.qkv, in_.positions, N, Hq, D, Q, c_.rope_theta);
      be_.rope_forward(a.qkv + A, in_.positions, N, Hkv, D, Q, c_.rope_theta);
    }
    tag("attention fwd");
    be_.attention_forward(a.att, a.lse, a.qkv, a.qkv + A, a.qkv + A + Hkv * D, Q, in_.cu, in_.nseq,
                          Hq, Hkv, D, scale());
    tag("matmul");
    linear_forward(tmp_, a.att, Pl(l, "attn.proj.weight", false), Pl(l, "attn.proj.bias", false), N,
                   A, C);
    tag("residual");
    be_.add(a.x_mid, a.x_in, tmp_, int64_t(N) * C);
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.x_mid, Pl(l, "norm2.weight", false),
                 Pl(l, "norm2.bias", false));
    tag("matmul");
    linear_forward(a.fc, a.ln2, Pl(l, "mlp.fc.weight", false), Pl(l, "mlp.fc.bias", false), N, C,
                   FC);
    tag("activation");
    if (c_.family == Family::GPT2)
      be_.gelu_forward(a.act, a.fc, int64_t(N) * F);
    else
      be_.swiglu_forward(a.act, a.fc, N, F);
    tag("matmul");
    linear_forward(tmp_, a.act, Pl(l, "mlp.proj.weight", false), Pl(l, "mlp.proj.bias", false), N,
                   F, C);
    tag("residual");
    be_.add(x_out, a.x_mid, tmp_, int64_t(N) * C);
  }

  void block_backward(int l) {
    const Acts& a = acts_[l];
    const int N = N_, C = c_.d_model, Q = c_.qkv_dim(), Hq = c_.n_head, Hkv = c_.n_kv_head,
              D = c_.head_dim, A = Hq * D, F = c_.d_ff, FC = c_.fc_dim();
    tag("matmul");
    linear_backward(dact_, Pl(l, "mlp.proj.weight", true), Pl(l, "mlp.proj.bias", true), dres_,
                    a.act, Pl(l, "mlp.proj.weight", false), N, F, C);
    tag("activation");
    if (c_.family == Family::GPT2)
      be_.gelu_backward(dfc_, a.fc, dact_, int64_t(N) * F);
    else
      be_.swiglu_backward(dfc_, a.fc, dact_, N, F);
    tag("matmul");
    linear_backward(dln_, Pl(l, "mlp.fc.weight", true), Pl(l, "mlp.fc.bias", true), dfc_, a.ln2,
                    Pl(l, "mlp.fc.weight", false), N, C, FC);
    norm_backward(dtmp_, Pl(l, "norm2.weight", true), Pl(l, "norm2.bias", true), dln_, a.x_mid,
                  Pl(l, "norm2.weight", false), a.ln2_mean, a.ln2_rstd);
    tag("residual");
    be_.add_inplace(dres_, dtmp_, int64_t(N) * C);
    tag("matmul");
    linear_backward(datt_, Pl(l, "attn.proj.weight", true), Pl(l, "attn.proj.bias", true), dres_,
                    a.att, Pl(l, "attn.proj.weight", false), N, A, C);
    tag("attention bwd");
    const float* q = a.qkv;
    be_.attention_backward(dqkv_, dqkv_ + A, dqkv_ + A + Hkv * D, datt_, q, q + A, q + A + Hkv * D,
                           a.att, a.lse, Q, in_.cu, in_.nseq, Hq, Hkv, D, scale());
    if (c_.uses_rope()) {
      tag("rope");
      be_.rope_backward(dqkv_, in_.positions, N, Hq, D, Q, c_.rope_theta);
      be_.rope_backward(dqkv_ + A, in_.positions, N, Hkv, D, Q, c_.rope_theta);
    }
    tag("matmul");
    linear_backward(dln_, Pl(l, "attn.qkv.weight", true), Pl(l, "attn.qkv.bias", true), dqkv_,
                    a.ln1, Pl(l, "attn.qkv.weight", false), N, C, Q);
    norm_backward(dtmp_, Pl(l, "norm1.weight", true), Pl(l, "norm1.bias", true), dln_, a.x_in,
                  Pl(l, "norm1.weight", false), a.ln1_mean, a.ln1_rstd);
    tag("residual");
    be_.add_inplace(dres_, dtmp_, int64_t(N) * C);
  }

  double head(float dloss) {
    const int N = N_, C = c_.d_model, V = c_.vocab;
    const float* lnf_b = c_.bias ? P("final_norm.bias") : nullptr;
    norm_forward(lnf_, lnf_mean_, lnf_rstd_, x_final_, P("final_norm.weight"), lnf_b);
    const float* W = c_.tied ? P("embed.wte") : P("head.weight");
    float* dW = c_.tied ? G("embed.wte") : G("head.weight");
    for (int r0 = 0; r0 < N; r0 += chunk_) {
      const int n = std::min(chunk_, N - r0);
      tag("head matmul");
      be_.matmul_forward(logits_, lnf_ + int64_t(r0) * C, W, nullptr, n, C, V);
      tag("cross-entropy");
      be_.cross_entropy(losses_ + r0, logits_, logits_, in_.targets + r0, n, V, dloss, nullptr);
      tag("head matmul");
      be_.matmul_backward(dln_ + int64_t(r0) * C, dW, nullptr, logits_, lnf_ + int64_t(r0) * C, W,
                          n, C, V);
    }
    std::vector<float> losses(N);
    download_(losses.data(), losses_, size_t(N));
    double sum = 0;
    for (int i = 0; i < N; ++i) sum += losses[i];  // fixed order, as the decoder
    float* gb = c_.bias ? G("final_norm.bias") : nullptr;
    norm_backward(dres_, G("final_norm.weight"), gb, dln_, x_final_, P("final_norm.weight"),
                  lnf_mean_, lnf_rstd_);
    return sum;
  }

  Backend& be_;
  ModelConfig c_;
  const ParamSet& layout_;
  float *p_, *g_;
  int N_, chunk_;
  Download download_;
  In in_{};
  std::vector<Acts> acts_;
  float *x_final_, *lnf_, *lnf_mean_, *lnf_rstd_, *losses_, *dres_, *dln_, *dtmp_, *tmp_, *datt_,
      *dqkv_, *dfc_, *dact_, *logits_;
};

}  // namespace loom::test
