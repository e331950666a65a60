// A float64 reference forward of a dense Decoder (GPT-2 and Llama families, with q/k/v biases
// and per-head q/k RMSNorm where the config has them), written from the definitions with no
// shared code: the per-token log-softmax of every position, to check the
// model's log-probabilities, logits and the serving engine's outputs against.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/decoder.h"

namespace loom::ref {

using Vec = std::vector<double>;

class ReferenceDecoder {
 public:
  explicit ReferenceDecoder(Decoder& m) : cfg_(m.config()), P_(m.params()) {}

  // The final norm's output [n, d_model] for one sequence (what a value head reads).
  std::vector<Vec> final_hidden(const std::vector<int32_t>& tokens) const {
    const int n = static_cast<int>(tokens.size()), C = cfg_.d_model;
    std::vector<Vec> x(n, Vec(C));
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < C; ++c) {
        x[i][c] = w("embed.wte")[int64_t(tokens[i]) * C + c];
        if (cfg_.uses_positions_table()) x[i][c] += w("embed.wpe")[int64_t(i) * C + c];
      }
    for (int l = 0; l < cfg_.n_layer; ++l) block(l, x);
    for (int i = 0; i < n; ++i) x[i] = norm("final_norm", x[i]);
    return x;
  }

  // Log-softmax rows [n, vocab] for one sequence of tokens at positions 0..n-1.
  std::vector<Vec> log_probs(const std::vector<int32_t>& tokens) const {
    const int n = static_cast<int>(tokens.size()), C = cfg_.d_model;
    std::vector<Vec> x(n, Vec(C));
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < C; ++c) {
        x[i][c] = w("embed.wte")[int64_t(tokens[i]) * C + c];
        if (cfg_.uses_positions_table()) x[i][c] += w("embed.wpe")[int64_t(i) * C + c];
      }
    for (int l = 0; l < cfg_.n_layer; ++l) block(l, x);
    const std::string head = cfg_.tied ? "embed.wte" : "head.weight";
    std::vector<Vec> out(n);
    for (int i = 0; i < n; ++i) {
      Vec h = norm("final_norm", x[i]);
      Vec logits = linear(head, h, cfg_.vocab, /*bias=*/false);
      double m = logits[0];
      for (double v : logits) m = std::max(m, v);
      double s = 0;
      for (double v : logits) s += std::exp(v - m);
      const double lse = m + std::log(s);
      for (double& v : logits) v -= lse;
      out[i] = std::move(logits);
    }
    return out;
  }

 private:
  const float* w(const std::string& name) const { return P_.data() + P_.info(name).offset; }
  bool has(const std::string& name) const { return P_.has(name); }

  Vec norm(const std::string& p, const Vec& x) const {
    const int C = cfg_.d_model;
    Vec y(C);
    if (cfg_.family == Family::GPT2) {
      double mean = 0, var = 0;
      for (double v : x) mean += v;
      mean /= C;
      for (double v : x) var += (v - mean) * (v - mean);
      var /= C;
      const double r = 1 / std::sqrt(var + cfg_.norm_eps);
      for (int c = 0; c < C; ++c)
        y[c] = (x[c] - mean) * r * w(p + ".weight")[c] + (has(p + ".bias") ? w(p + ".bias")[c] : 0);
    } else {
      double ms = 0;
      for (double v : x) ms += v * v;
      const double r = 1 / std::sqrt(ms / C + cfg_.norm_eps);
      for (int c = 0; c < C; ++c) y[c] = x[c] * r * w(p + ".weight")[c];
    }
    return y;
  }

  // y[out] = W[out, in] x + b; `p` names the weight itself when bias is false.
  Vec linear(const std::string& p, const Vec& x, int out, bool bias = true) const {
    const std::string wn = bias ? p + ".weight" : p;
    const float* W = w(wn);
    const int in = static_cast<int>(x.size());
    Vec y(out, 0.0);
    for (int o = 0; o < out; ++o) {
      double s = bias && has(p + ".bias") ? w(p + ".bias")[o] : 0.0;
      for (int i = 0; i < in; ++i) s += double(W[int64_t(o) * in + i]) * x[i];
      y[o] = s;
    }
    return y;
  }

  // Rotate-half RoPE of one head (D dims) at position pos.
  void rope(double* h, int pos) const {
    const int D = cfg_.head_dim, half = D / 2;
    for (int j = 0; j < half; ++j) {
      const double a = pos * std::pow(double(cfg_.rope_theta), -2.0 * j / D);
      const double x0 = h[j], x1 = h[j + half];
      h[j] = x0 * std::cos(a) - x1 * std::sin(a);
      h[j + half] = x1 * std::cos(a) + x0 * std::sin(a);
    }
  }

  // RMSNorm of one head's D values in place (weight `p`.weight of D).
  void head_rms_norm(double* h, const std::string& p) const {
    const int D = cfg_.head_dim;
    double ms = 0;
    for (int e = 0; e < D; ++e) ms += h[e] * h[e];
    const double r = 1 / std::sqrt(ms / D + cfg_.norm_eps);
    for (int e = 0; e < D; ++e) h[e] = h[e] * r * w(p + ".weight")[e];
  }

  void block(int l, std::vector<Vec>& x) const {
    const std::string p = "blocks." + std::to_string(l);
    const int n = static_cast<int>(x.size()), C = cfg_.d_model, D = cfg_.head_dim;
    const int Hq = cfg_.n_head, Hkv = cfg_.n_kv_head, F = cfg_.d_ff;
    std::vector<Vec> qkv(n);
    for (int i = 0; i < n; ++i) {
      qkv[i] = linear(p + ".attn.qkv", norm(p + ".norm1", x[i]), cfg_.qkv_dim());
      if (cfg_.qk_norm)
        for (int h = 0; h < Hq + Hkv; ++h)
          head_rms_norm(qkv[i].data() + h * D, p + (h < Hq ? ".attn.q_norm" : ".attn.k_norm"));
      if (cfg_.uses_rope())
        for (int h = 0; h < Hq + Hkv; ++h) rope(qkv[i].data() + h * D, i);
    }
    for (int i = 0; i < n; ++i) {
      Vec att(Hq * D, 0.0);
      for (int h = 0; h < Hq; ++h) {
        const int kv = h / (Hq / Hkv);
        Vec s(i + 1);
        double m = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int e = 0; e < D; ++e) d += qkv[i][h * D + e] * qkv[j][(Hq + kv) * D + e];
          s[j] = d / std::sqrt(double(D));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - m));
        for (int j = 0; j <= i; ++j)
          for (int e = 0; e < D; ++e) att[h * D + e] += s[j] / z * qkv[j][(Hq + Hkv + kv) * D + e];
      }
      Vec o = linear(p + ".attn.proj", att, C);
      for (int c = 0; c < C; ++c) x[i][c] += o[c];
    }
    for (int i = 0; i < n; ++i) {
      Vec fc = linear(p + ".mlp.fc", norm(p + ".norm2", x[i]), cfg_.fc_dim());
      Vec act(F);
      for (int f = 0; f < F; ++f) {
        if (cfg_.family == Family::GPT2) {
          const double v = fc[f];
          act[f] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        } else {
          const double g = fc[f], u = fc[F + f];
          act[f] = g / (1 + std::exp(-g)) * u;
        }
      }
      Vec o = linear(p + ".mlp.proj", act, C);
      for (int c = 0; c < C; ++c) x[i][c] += o[c];
    }
  }

  const ModelConfig& cfg_;
  const ParamSet& P_;
};

}  // namespace loom::ref
