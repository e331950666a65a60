// Mixture-of-experts ops (see moe.h). Per-token work runs on OpenMP threads, one token per
// iteration with a fixed inner order, so the results do not depend on the thread count.
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace loom::cpu {

namespace {

inline size_t at(int64_t row, int64_t cols) {
  return static_cast<size_t>(row * cols);
}

}  // namespace

void moe_router_forward(float* scores, int32_t* topk_idx, float* topk_w, const float* logits, int N,
                        int E, int k, RouterScore score, bool renormalize) {
  LOOM_CHECK(E >= 1 && k >= 1 && k <= E, "MoE router needs 1 <= k <= E (k=", k, ", E=", E, ")");
#pragma omp parallel for schedule(static) if (worth_parallel(N, E))
  for (int t = 0; t < N; ++t) {
    const float* l = logits + at(t, E);
    float* s = scores + at(t, E);
    if (score == RouterScore::Softmax) {
      float m = l[0];
      for (int e = 1; e < E; ++e) m = std::max(m, l[e]);
      double sum = 0.0;
      for (int e = 0; e < E; ++e) {
        s[e] = std::exp(l[e] - m);
        sum += s[e];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int e = 0; e < E; ++e) s[e] *= inv;
    } else {
      for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-l[e]));
    }
    // Selection in the order (score descending, index ascending): slot j takes the best expert
    // that comes strictly after slot j-1's in that order. O(k E), no bookkeeping.
    int32_t* idx = topk_idx + at(t, k);
    float* w = topk_w + at(t, k);
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (j > 0) {
          const int prev = idx[j - 1];
          const bool after = s[e] < s[prev] || (s[e] == s[prev] && e > prev);
          if (!after) continue;
        }
        if (best < 0 || s[e] > s[best]) best = e;
      }
      idx[j] = best;  // -1 only for NaN scores; moe_plan_routing then names the token
      w[j] = best >= 0 ? s[best] : 0.0f;
    }
    if (renormalize) {
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += w[j];
      const float inv = sum > 0.0 ? static_cast<float>(1.0 / sum) : 0.0f;
      for (int j = 0; j < k; ++j) w[j] *= inv;
    }
  }
}

void moe_router_backward(float* dlogits, const float* dtopk_w, const float* dscores,
                         const float* scores, const int32_t* topk_idx, int N, int E, int k,
                         RouterScore score, bool renormalize) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, E))
  for (int t = 0; t < N; ++t) {
    const float* s = scores + at(t, E);
    const int32_t* idx = topk_idx + at(t, k);
    const float* dw = dtopk_w + at(t, k);
    float* ds = dlogits + at(t, E);  // first holds dL/dscores, then becomes dL/dlogits
    for (int e = 0; e < E; ++e) ds[e] = dscores ? dscores[at(t, E) + e] : 0.0f;
    if (renormalize) {
      // w_j = s_j / S with S = sum of the chosen scores: ds_j = (dw_j - sum_l dw_l w_l) / S.
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += s[idx[j]];
      double dot = 0.0;
      for (int j = 0; j < k; ++j) dot += static_cast<double>(dw[j]) * (s[idx[j]] / sum);
      for (int j = 0; j < k; ++j) ds[idx[j]] += static_cast<float>((dw[j] - dot) / sum);
    } else {
      for (int j = 0; j < k; ++j) ds[idx[j]] += dw[j];
    }
    if (score == RouterScore::Softmax) {
      double dot = 0.0;
      for (int e = 0; e < E; ++e) dot += static_cast<double>(s[e]) * ds[e];
      for (int e = 0; e < E; ++e) ds[e] = s[e] * (ds[e] - static_cast<float>(dot));
    } else {
      for (int e = 0; e < E; ++e) ds[e] = ds[e] * s[e] * (1.0f - s[e]);
    }
  }
}

double moe_aux_loss(float* dscores, const float* scores, const int32_t* topk_idx, int N, int E,
                    int k, float coeff, float dloss) {
  if (N == 0) return 0.0;
  std::vector<int64_t> assigned(E, 0);
  for (int64_t i = 0; i < static_cast<int64_t>(N) * k; ++i) {
    const int32_t e = topk_idx[i];
    LOOM_CHECK(e >= 0 && e < E, "MoE aux loss: token ", i / k, " slot ", i % k, " has expert ", e,
               ", outside [0, ", E, ")");
    ++assigned[e];
  }
  std::vector<double> mean_score(E, 0.0);
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e) mean_score[e] += scores[at(t, E) + e];
  double loss = 0.0;
  std::vector<float> grad(E);
  for (int e = 0; e < E; ++e) {
    const double f = static_cast<double>(assigned[e]) / (static_cast<double>(N) * k);
    mean_score[e] /= N;
    loss += f * mean_score[e];
    grad[e] = static_cast<float>(static_cast<double>(dloss) * coeff * E * f / N);
  }
  if (dscores) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, E))
    for (int t = 0; t < N; ++t)
      for (int e = 0; e < E; ++e) dscores[at(t, E) + e] += grad[e];
  }
  return static_cast<double>(coeff) * E * loss;
}

int moe_capacity(int N, int E, int k, double capacity_factor) {
  LOOM_CHECK(capacity_factor > 0.0, "MoE capacity factor must be positive (got ", capacity_factor,
             "); leave it unset for dropless routing");
  return static_cast<int>(std::ceil(capacity_factor * N * k / E));
}

MoeRouting moe_plan_routing(const int32_t* topk_idx, int N, int E, int k, int capacity) {
  MoeRouting r;
  r.N = N;
  r.E = E;
  r.k = k;
  const int64_t pairs = static_cast<int64_t>(N) * k;
  // Pass 1: each pair's position within its expert, in token order.
  std::vector<int32_t> position(pairs);
  std::vector<int32_t> assigned(E, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t e = topk_idx[i];
    LOOM_CHECK(e >= 0 && e < E, "MoE routing: token ", i / k, " slot ", i % k, " has expert ", e,
               ", outside [0, ", E, ")");
    position[i] = assigned[e]++;
  }
  r.counts.resize(E);
  r.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    r.counts[e] = capacity < 0 ? assigned[e] : std::min(assigned[e], capacity);
    r.dropped += assigned[e] - r.counts[e];
    r.offsets[e + 1] = r.offsets[e] + r.counts[e];
  }
  // Pass 2: kept pairs get their row.
  r.row_of.assign(pairs, -1);
  r.token_of.resize(r.rows());
  r.slot_of.resize(r.rows());
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t e = topk_idx[i];
    if (position[i] >= r.counts[e]) continue;
    const int32_t row = r.offsets[e] + position[i];
    r.row_of[i] = row;
    r.token_of[row] = static_cast<int32_t>(i / k);
    r.slot_of[row] = static_cast<int32_t>(i % k);
  }
  return r;
}

void moe_plan_routing(int32_t* plan, const int32_t* topk_idx, int N, int E, int k, int capacity) {
  const MoeRouting r = moe_plan_routing(topk_idx, N, E, k, capacity);
  int32_t* assigned = plan;
  int32_t* counts = plan + E;
  int32_t* offsets = counts + E;
  int32_t* row_of = offsets + E + 1;
  int32_t* token_of = row_of + int64_t(N) * k;
  std::fill(assigned, assigned + E, 0);
  for (int64_t i = 0; i < int64_t(N) * k; ++i) ++assigned[topk_idx[i]];
  std::copy(r.counts.begin(), r.counts.end(), counts);
  std::copy(r.offsets.begin(), r.offsets.end(), offsets);
  std::copy(r.row_of.begin(), r.row_of.end(), row_of);
  std::copy(r.token_of.begin(), r.token_of.end(), token_of);
  std::fill(token_of + r.rows(), token_of + int64_t(N) * k, 0);
}

void moe_expert_stats(float* stats, const float* scores, const int32_t* topk_idx, int N, int E,
                      int k) {
  std::vector<double> score_sum(E, 0.0);
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e) score_sum[size_t(e)] += scores[at(t, E) + e];
  std::fill(stats, stats + 2 * E + 1, 0.f);
  // Counts are exact in fp32 at these sizes.
  for (int64_t i = 0; i < int64_t(N) * k; ++i) {
    const int32_t e = topk_idx[i];
    LOOM_CHECK(e >= 0 && e < E, "MoE statistics: token ", i / k, " slot ", i % k, " has expert ", e,
               ", outside [0, ", E, ")");
    stats[e] += 1.f;
  }
  for (int e = 0; e < E; ++e) stats[E + e] = static_cast<float>(score_sum[size_t(e)]);
  stats[2 * E] = static_cast<float>(N);
}

void moe_permute(float* out, const float* x, const MoeRouting& routing, int C) {
  moe_permute(out, x, routing.token_of.data(), routing.rows(), C);
}
void moe_permute_backward(float* dx, const float* dout, const MoeRouting& routing, int C) {
  moe_permute_backward(dx, dout, routing.row_of.data(), routing.N, routing.k, C);
}
void moe_unpermute(float* y, const float* expert_out, const float* topk_w,
                   const MoeRouting& routing, int C) {
  moe_unpermute(y, expert_out, topk_w, routing.row_of.data(), routing.N, routing.k, C);
}
void moe_unpermute_backward(float* dexpert_out, float* dtopk_w, const float* dy,
                            const float* expert_out, const float* topk_w, const MoeRouting& routing,
                            int C) {
  moe_unpermute_backward(dexpert_out, dtopk_w, dy, expert_out, topk_w, routing.row_of.data(),
                         routing.N, routing.k, C);
}

void moe_permute(float* out, const float* x, const int32_t* token_of, int rows, int C) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows, C))
  for (int r = 0; r < rows; ++r)
    std::memcpy(out + at(r, C), x + at(token_of[r], C), sizeof(float) * C);
}

void moe_permute_backward(float* dx, const float* dout, const int32_t* row_of, int N, int k,
                          int C) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, static_cast <int64_t>(k) * C))
  for (int t = 0; t < N; ++t) {
    float* d = dx + at(t, C);
    std::fill(d, d + C, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int32_t row = row_of[at(t, k) + j];
      if (row < 0) continue;
      const float* g = dout + at(row, C);
#pragma omp simd
      for (int c = 0; c < C; ++c) d[c] += g[c];
    }
  }
}

void moe_unpermute(float* y, const float* expert_out, const float* topk_w, const int32_t* row_of,
                   int N, int k, int C) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, static_cast <int64_t>(k) * C))
  for (int t = 0; t < N; ++t) {
    float* out = y + at(t, C);
    std::fill(out, out + C, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int32_t row = row_of[at(t, k) + j];
      if (row < 0) continue;
      const float w = topk_w[at(t, k) + j];
      const float* src = expert_out + at(row, C);
#pragma omp simd
      for (int c = 0; c < C; ++c) out[c] += w * src[c];
    }
  }
}

void moe_unpermute_backward(float* dexpert_out, float* dtopk_w, const float* dy,
                            const float* expert_out, const float* topk_w, const int32_t* row_of,
                            int N, int k, int C) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, static_cast <int64_t>(k) * C))
  for (int t = 0; t < N; ++t) {
    const float* g = dy + at(t, C);
    for (int j = 0; j < k; ++j) {
      const int32_t row = row_of[at(t, k) + j];
      if (row < 0) {
        dtopk_w[at(t, k) + j] = 0.0f;
        continue;
      }
      const float w = topk_w[at(t, k) + j];
      const float* src = expert_out + at(row, C);
      float* d = dexpert_out + at(row, C);
      double dot = 0.0;
      for (int c = 0; c < C; ++c) {
        d[c] = w * g[c];
        dot += static_cast<double>(g[c]) * src[c];
      }
      dtopk_w[at(t, k) + j] = static_cast<float>(dot);
    }
  }
}

void moe_grouped_mlp_forward(float* y, float* h, float* a, const float* x, const float* w1,
                             const float* w2, const int32_t* offsets, int E, int C, int F,
                             MoeActivation act) {
  const int H = moe_hidden_width(F, act);
  const int rows = offsets[E];
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n > 0)
      matmul_forward(h + at(offsets[e], H), x + at(offsets[e], C), w1 + at(e, int64_t{H} * C),
                     nullptr, n, C, H);
  }
  if (act == MoeActivation::GeLU)
    gelu_forward(a, h, static_cast<int64_t>(rows) * F);
  else
    swiglu_forward(a, h, rows, F);
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n > 0)
      matmul_forward(y + at(offsets[e], C), a + at(offsets[e], F), w2 + at(e, int64_t{C} * F),
                     nullptr, n, F, C);
  }
}

void moe_grouped_mlp_backward(float* dx, float* dw1, float* dw2, float* scratch, const float* dy,
                              const float* x, const float* h, const float* a, const float* w1,
                              const float* w2, const int32_t* offsets, int E, int C, int F,
                              MoeActivation act) {
  const int H = moe_hidden_width(F, act);
  const int rows = offsets[E];
  float* da = scratch;                // [rows, F]
  float* dh = scratch + at(rows, F);  // [rows, H]
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n > 0)
      matmul_backward(da + at(offsets[e], F), dw2 ? dw2 + at(e, int64_t{C} * F) : nullptr, nullptr,
                      dy + at(offsets[e], C), a + at(offsets[e], F), w2 + at(e, int64_t{C} * F), n,
                      F, C);
  }
  if (act == MoeActivation::GeLU)
    gelu_backward(dh, h, da, static_cast<int64_t>(rows) * F);
  else
    swiglu_backward(dh, h, da, rows, F);
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n > 0)
      matmul_backward(dx + at(offsets[e], C), dw1 ? dw1 + at(e, int64_t{H} * C) : nullptr, nullptr,
                      dh + at(offsets[e], H), x + at(offsets[e], C), w1 + at(e, int64_t{H} * C), n,
                      C, H);
  }
}

}  // namespace loom::cpu
