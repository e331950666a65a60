// Float64 reference implementations of the kernel ops: written for clarity (the textbook
// formula, no fusion, no tricks), used to check the float kernels' forward results and, by
// finite differences, their gradients. Shapes and conventions: see kernels/backend.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

namespace loom::ref {

using Vec = std::vector<double>;

// C = alpha op(A) op(B) + beta C (row-major, leading dimensions as in Backend::gemm).
inline void gemm(bool ta, bool tb, int M, int N, int K, double alpha, const Vec& A, int lda,
                 const Vec& B, int ldb, double beta, Vec& C, int ldc) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0.0;
      for (int k = 0; k < K; ++k) {
        const double a =
            ta ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
        const double b =
            tb ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
        s += a * b;
      }
      double& c = C[static_cast<size_t>(i) * ldc + j];
      c = alpha * s + (beta == 0.0 ? 0.0 : beta * c);
    }
}

// out[N,OC] = inp[N,IC] weight[OC,IC]^T + bias (bias may be empty).
inline Vec matmul(const Vec& inp, const Vec& w, const Vec& bias, int N, int IC, int OC) {
  Vec out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < IC; ++i) s += inp[n * IC + i] * w[o * IC + i];
      out[n * OC + o] = s;
    }
  return out;
}

struct NormOut {
  Vec out, mean, rstd;
};

inline NormOut layernorm(const Vec& x, const Vec& w, const Vec& b, int N, int C, double eps) {
  NormOut r{Vec(x.size()), Vec(N), Vec(N)};
  for (int n = 0; n < N; ++n) {
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - m) * (x[n * C + c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c)
      r.out[n * C + c] = (x[n * C + c] - m) * s * w[c] + (b.empty() ? 0.0 : b[c]);
    r.mean[n] = m;
    r.rstd[n] = s;
  }
  return r;
}

inline NormOut rmsnorm(const Vec& x, const Vec& w, int N, int C, double eps) {
  NormOut r{Vec(x.size()), Vec(), Vec(N)};
  for (int n = 0; n < N; ++n) {
    double ms = 0.0;
    for (int c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c];
    const double s = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = x[n * C + c] * s * w[c];
    r.rstd[n] = s;
  }
  return r;
}

inline Vec gelu(const Vec& x) {
  Vec y(x.size());
  const double k = std::sqrt(2.0 / std::numbers::pi);
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

inline Vec swiglu(const Vec& inp, int N, int F) {
  Vec y(static_cast<size_t>(N) * F);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < F; ++j) {
      const double g = inp[n * 2 * F + j], u = inp[n * 2 * F + F + j];
      y[n * F + j] = g / (1.0 + std::exp(-g)) * u;
    }
  return y;
}

// Rotate-half RoPE on rows of stride ld (elements beyond H*D are left as they are).
inline Vec rope(Vec x, const std::vector<int32_t>& pos, int N, int H, int D, int ld, double theta) {
  const int half = D / 2;
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < half; ++j) {
        const double angle = pos[n] * std::pow(theta, -2.0 * j / D);
        double& a = x[static_cast<size_t>(n) * ld + h * D + j];
        double& b = x[static_cast<size_t>(n) * ld + h * D + j + half];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(angle) - b0 * std::sin(angle);
        b = b0 * std::cos(angle) + a0 * std::sin(angle);
      }
  return x;
}

inline Vec softmax(const Vec& x, int rows, int cols) {
  Vec y(x.size());
  for (int r = 0; r < rows; ++r) {
    const double* row = x.data() + static_cast<size_t>(r) * cols;
    const double m = *std::max_element(row, row + cols);
    double s = 0.0;
    for (int j = 0; j < cols; ++j) s += std::exp(row[j] - m);
    for (int j = 0; j < cols; ++j) y[r * cols + j] = std::exp(row[j] - m) / s;
  }
  return y;
}

// Per-row -log softmax(logits)[target]; 0 for target < 0.
inline Vec cross_entropy(const Vec& logits, const std::vector<int32_t>& targets, int N, int V) {
  Vec loss(N, 0.0);
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    const double* row = logits.data() + static_cast<size_t>(n) * V;
    const double m = *std::max_element(row, row + V);
    double s = 0.0;
    for (int j = 0; j < V; ++j) s += std::exp(row[j] - m);
    loss[n] = std::log(s) + m - row[targets[n]];
  }
  return loss;
}

struct AdamState {
  Vec param, m, v;
};

// One AdamW step (decoupled weight decay, 1-based bias correction).
inline void adamw(AdamState& s, const Vec& grad, double lr, double b1, double b2, double eps,
                  double wd, double grad_scale, int64_t step) {
  for (size_t i = 0; i < s.param.size(); ++i) {
    const double g = grad[i] * grad_scale;
    s.m[i] = b1 * s.m[i] + (1 - b1) * g;
    s.v[i] = b2 * s.v[i] + (1 - b2) * g * g;
    const double mhat = s.m[i] / (1 - std::pow(b1, step));
    const double vhat = s.v[i] / (1 - std::pow(b2, step));
    s.param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * s.param[i]);
  }
}

}  // namespace loom::ref
