// Mixture-of-experts ops on the CPU, each a forward/backward pair on plain buffers (the same
// conventions as kernels/backend.h: parameter gradients ACCUMULATE, input gradients are
// WRITTEN). One MoE layer is
//
//   logits[N,E] = x W_router^T                     (an ordinary matmul, not here)
//   moe_router_forward      -> scores[N,E], topk_idx[N,k], topk_w[N,k]
//   moe_aux_loss            -> Switch/GShard load-balancing loss (+ its gradient on scores)
//   moe_plan_routing        -> which (token, slot) goes to which row of the expert buffer
//   moe_permute             -> xp[rows,C]: tokens grouped by expert, each expert contiguous
//   moe_grouped_mlp_forward -> yp[rows,C]: expert e's MLP on its rows (a loop of GEMMs)
//   moe_unpermute           -> y[N,C] = sum_j topk_w[t,j] * yp[row of (t,j)]
//
// and the backward runs the same chain in reverse. Expert parallelism later replaces the
// permuted buffer's local copy with an all-to-all; the routing plan says what goes where.
//
// Determinism: every output element is computed by one loop iteration in a fixed order, so
// results are bit-identical for any thread count (given a deterministic GEMM).
#pragma once

#include <cstdint>
#include <vector>

namespace loom::cpu {

enum class RouterScore {
  Softmax,  // scores = softmax(logits) over the E experts (Mixtral, Switch)
  Sigmoid,  // scores = sigmoid(logits) per expert (DeepSeek-V3 style)
};

// scores[N,E] from logits[N,E]; topk_idx[N,k] the k experts of largest score in descending
// order, ties broken by the lower expert index; topk_w[N,k] their scores, divided by the sum of
// the k scores when `renormalize` (so each token's weights sum to 1). 1 <= k <= E.
void moe_router_forward(float* scores, int32_t* topk_idx, float* topk_w, const float* logits, int N,
                        int E, int k, RouterScore score, bool renormalize);

// dlogits[N,E] (written) from the gradient of topk_w and, optionally (nullable), an extra
// gradient on the scores themselves (the auxiliary loss's). The top-k choice is piecewise
// constant, so it passes no gradient.
void moe_router_backward(float* dlogits, const float* dtopk_w, const float* dscores,
                         const float* scores, const int32_t* topk_idx, int N, int E, int k,
                         RouterScore score, bool renormalize);

// Load-balancing loss coeff * E * sum_e f_e * P_e, with f_e = (assignments to expert e) / (N k)
// (counted before any capacity dropping) and P_e = mean over tokens of scores[t,e]. f is
// piecewise constant, so the gradient flows through P only: when dscores is non-null,
// dscores[t,e] += dloss * coeff * E * f_e / N. Returns the loss (float64).
double moe_aux_loss(float* dscores, const float* scores, const int32_t* topk_idx, int N, int E,
                    int k, float coeff, float dloss);

// Rows each expert may take: ceil(capacity_factor * N * k / E). Throws loom::Error for a
// non-positive factor.
int moe_capacity(int N, int E, int k, double capacity_factor);

// Where each token's k copies go in the expert-grouped buffer.
struct MoeRouting {
  int N = 0, E = 0, k = 0;
  std::vector<int32_t> counts;    // [E] rows kept per expert
  std::vector<int32_t> offsets;   // [E+1] expert e owns rows [offsets[e], offsets[e+1])
  std::vector<int32_t> row_of;    // [N*k] row of (token t, slot j) at t*k+j, or -1 if dropped
  std::vector<int32_t> token_of;  // [rows] the token each row copies
  std::vector<int32_t> slot_of;   // [rows] which of that token's k slots it is
  int64_t dropped = 0;            // (token, slot) pairs over capacity
  int rows() const { return offsets.empty() ? 0 : offsets.back(); }
};

// Groups the N*k assignments by expert; within an expert, rows follow token order (then slot).
// capacity < 0: dropless (every assignment kept). capacity >= 0: each expert keeps its first
// `capacity` assignments in token order and drops the rest (deterministic, position-based).
// Throws loom::Error naming the token when an index is outside [0, E).
MoeRouting moe_plan_routing(const int32_t* topk_idx, int N, int E, int k, int capacity);

// The plan in one int32 array (Backend::moe_plan_routing's layout): assigned [E], counts [E],
// offsets [E+1], row_of [N*k], token_of [N*k] (its first rows() entries used).
void moe_plan_routing(int32_t* plan, const int32_t* topk_idx, int N, int E, int k, int capacity);

// stats[2E+1] = [assignments per expert, per-expert score sums (double in token order, then
// float), N]: what moe_aux_loss needs, in a form a token group can sum (Backend op).
void moe_expert_stats(float* stats, const float* scores, const int32_t* topk_idx, int N, int E,
                      int k);

// out[rows,C] = x[token_of[r],:]; backward: dx[t,:] (written) = sum of its kept rows' dout.
void moe_permute(float* out, const float* x, const MoeRouting& routing, int C);
void moe_permute_backward(float* dx, const float* dout, const MoeRouting& routing, int C);
// The same over the plan's raw arrays (the Backend ops).
void moe_permute(float* out, const float* x, const int32_t* token_of, int rows, int C);
void moe_permute_backward(float* dx, const float* dout, const int32_t* row_of, int N, int k, int C);
void moe_unpermute(float* y, const float* expert_out, const float* topk_w, const int32_t* row_of,
                   int N, int k, int C);
void moe_unpermute_backward(float* dexpert_out, float* dtopk_w, const float* dy,
                            const float* expert_out, const float* topk_w, const int32_t* row_of,
                            int N, int k, int C);

// y[N,C] (written) = sum over kept slots j of topk_w[t,j] * expert_out[row_of[t,j],:] (a token
// whose slots were all dropped gets zeros: the residual carries it). Backward writes
// dexpert_out[rows,C] = topk_w * dy and dtopk_w[N,k] = <dy[t], expert_out[row]> (0 if dropped).
void moe_unpermute(float* y, const float* expert_out, const float* topk_w,
                   const MoeRouting& routing, int C);
void moe_unpermute_backward(float* dexpert_out, float* dtopk_w, const float* dy,
                            const float* expert_out, const float* topk_w, const MoeRouting& routing,
                            int C);

enum class MoeActivation {
  GeLU,    // h = x W1^T (F wide), a = gelu(h)
  SwiGLU,  // h = x W1^T (2F wide: [gate | up]), a = silu(gate) * up
};

// Width of W1's output (F, or 2F for SwiGLU).
inline int moe_hidden_width(int F, MoeActivation act) {
  return act == MoeActivation::SwiGLU ? 2 * F : F;
}

// Expert MLPs over the expert-grouped rows: expert e (rows offsets[e]..offsets[e+1]) computes
// y = act(x W1[e]^T) W2[e]^T, w1[E, H, C] with H = moe_hidden_width(F, act), w2[E, C, F].
// Saves h[rows,H] and a[rows,F] for backward. Experts with no rows are skipped.
void moe_grouped_mlp_forward(float* y, float* h, float* a, const float* x, const float* w1,
                             const float* w2, const int32_t* offsets, int E, int C, int F,
                             MoeActivation act);
// dx[rows,C] written; dw1, dw2 accumulated. scratch holds rows*(F + H) floats.
void moe_grouped_mlp_backward(float* dx, float* dw1, float* dw2, float* scratch, const float* dy,
                              const float* x, const float* h, const float* a, const float* w1,
                              const float* w2, const int32_t* offsets, int E, int C, int F,
                              MoeActivation act);

}  // namespace loom::cpu
