// MoE ops (kernels/cpu/moe.h) against float64 references written from the definitions: router
// (softmax / sigmoid, top-k with ties to the lower expert, renormalised or not), auxiliary
// load-balancing loss, capacity dropping, permute / unpermute, grouped expert MLPs (GeLU and
// SwiGLU); every backward against central finite differences of the reference; a whole layer
// (router -> permute -> grouped MLP -> unpermute, plus the aux loss) gradient-checked end to
// end; bit-identical results on 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "core/error.h"
#include "grad_check.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/moe.h"
#include "same_bits.h"

namespace {

using loom::cpu::MoeActivation;
using loom::cpu::MoeRouting;
using loom::cpu::RouterScore;
using loom::test::all_close;
using loom::test::numeric_gradient;
using loom::test::random_floats;
using loom::test::to_f64;
using loom::test::Vec;

std::vector<float> to_f32(const Vec& v) {
  return std::vector<float>(v.begin(), v.end());
}

// ---- float64 references -------------------------------------------------------------------

struct RefRouter {
  Vec scores;
  std::vector<int32_t> idx;
  Vec w;
};

RefRouter ref_router(const Vec& logits, int N, int E, int k, RouterScore sc, bool renorm) {
  RefRouter r{Vec(logits.size()), std::vector<int32_t>(N * k), Vec(N * k)};
  for (int t = 0; t < N; ++t) {
    const double* l = &logits[t * E];
    double* s = &r.scores[t * E];
    if (sc == RouterScore::Softmax) {
      double m = l[0], sum = 0.0;
      for (int e = 1; e < E; ++e) m = std::max(m, l[e]);
      for (int e = 0; e < E; ++e) sum += std::exp(l[e] - m);
      for (int e = 0; e < E; ++e) s[e] = std::exp(l[e] - m) / sum;
    } else {
      for (int e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-l[e]));
    }
    std::vector<bool> taken(E, false);
    double sum = 0.0;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || s[e] > s[best])) best = e;
      taken[best] = true;
      r.idx[t * k + j] = best;
      r.w[t * k + j] = s[best];
      sum += s[best];
    }
    if (renorm)
      for (int j = 0; j < k; ++j) r.w[t * k + j] /= sum;
  }
  return r;
}

double ref_aux(const Vec& scores, const std::vector<int32_t>& idx, int N, int E, int k,
               double coeff) {
  double loss = 0.0;
  for (int e = 0; e < E; ++e) {
    double f = 0.0, P = 0.0;
    for (int i = 0; i < N * k; ++i) f += idx[i] == e;
    for (int t = 0; t < N; ++t) P += scores[t * E + e];
    loss += (f / (N * k)) * (P / N);
  }
  return coeff * E * loss;
}

// kept[t*k+j]: whether (t, j) survives capacity (first `cap` per expert in token order).
std::vector<bool> ref_kept(const std::vector<int32_t>& idx, int N, int E, int k, int cap) {
  std::vector<bool> kept(N * k);
  std::vector<int> seen(E, 0);
  for (int i = 0; i < N * k; ++i) kept[i] = cap < 0 || seen[idx[i]]++ < cap;
  return kept;
}

double gelu(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

// One expert's MLP on one row: y[C] = W2[e] act(W1[e] x).
Vec ref_expert(const double* x, const Vec& w1, const Vec& w2, int e, int C, int F,
               MoeActivation act) {
  const int H = loom::cpu::moe_hidden_width(F, act);
  Vec h(H), a(F), y(C, 0.0);
  for (int o = 0; o < H; ++o) {
    double s = 0.0;
    for (int c = 0; c < C; ++c) s += w1[(size_t)e * H * C + o * C + c] * x[c];
    h[o] = s;
  }
  for (int f = 0; f < F; ++f)
    a[f] = act == MoeActivation::GeLU ? gelu(h[f]) : h[f] / (1.0 + std::exp(-h[f])) * h[F + f];
  for (int c = 0; c < C; ++c)
    for (int f = 0; f < F; ++f) y[c] += w2[(size_t)e * C * F + c * F + f] * a[f];
  return y;
}

// ---- float layer, chained from the ops ----------------------------------------------------

struct LayerShape {
  int N, C, E, k, F;
  RouterScore score;
  bool renorm;
  MoeActivation act;
  double capacity_factor;  // <= 0: dropless
  float aux_coeff;
  int H() const { return loom::cpu::moe_hidden_width(F, act); }
  int capacity() const {
    return capacity_factor > 0 ? loom::cpu::moe_capacity(N, E, k, capacity_factor) : -1;
  }
};

struct LayerParams {
  std::vector<float> x, wr, w1, w2, gy;  // gy: dL/dy (the loss is <y, gy> + aux)
};

LayerParams random_params(const LayerShape& s, uint64_t seed) {
  return {random_floats((size_t)s.N * s.C, seed),
          random_floats((size_t)s.E * s.C, seed + 1, -1.5f, 1.5f),
          random_floats((size_t)s.E * s.H() * s.C, seed + 2, -0.6f, 0.6f),
          random_floats((size_t)s.E * s.C * s.F, seed + 3, -0.6f, 0.6f),
          random_floats((size_t)s.N * s.C, seed + 4)};
}

struct LayerResult {
  std::vector<float> y, dx, dwr, dw1, dw2;
  double aux = 0.0;
  int64_t dropped = 0;
};

LayerResult run_layer(const LayerShape& s, const LayerParams& p) {
  namespace cpu = loom::cpu;
  const int N = s.N, C = s.C, E = s.E, k = s.k, F = s.F, H = s.H();
  std::vector<float> logits((size_t)N * E), scores(logits.size()), w((size_t)N * k);
  std::vector<int32_t> idx((size_t)N * k);
  cpu::matmul_forward(logits.data(), p.x.data(), p.wr.data(), nullptr, N, C, E);
  cpu::moe_router_forward(scores.data(), idx.data(), w.data(), logits.data(), N, E, k, s.score,
                          s.renorm);
  LayerResult r;
  std::vector<float> dscores((size_t)N * E, 0.0f);
  r.aux = cpu::moe_aux_loss(dscores.data(), scores.data(), idx.data(), N, E, k, s.aux_coeff, 1.0f);
  const MoeRouting routing = cpu::moe_plan_routing(idx.data(), N, E, k, s.capacity());
  r.dropped = routing.dropped;
  const int rows = routing.rows();
  std::vector<float> xp((size_t)rows * C), h((size_t)rows * H), a((size_t)rows * F),
      yp((size_t)rows * C);
  cpu::moe_permute(xp.data(), p.x.data(), routing, C);
  cpu::moe_grouped_mlp_forward(yp.data(), h.data(), a.data(), xp.data(), p.w1.data(), p.w2.data(),
                               routing.offsets.data(), E, C, F, s.act);
  r.y.resize((size_t)N * C);
  cpu::moe_unpermute(r.y.data(), yp.data(), w.data(), routing, C);
  // Backward.
  std::vector<float> dyp((size_t)rows * C), dw((size_t)N * k), dxp((size_t)rows * C),
      scratch((size_t)rows * (F + H)), dlogits((size_t)N * E);
  cpu::moe_unpermute_backward(dyp.data(), dw.data(), p.gy.data(), yp.data(), w.data(), routing, C);
  r.dw1.assign(p.w1.size(), 0.0f);
  r.dw2.assign(p.w2.size(), 0.0f);
  cpu::moe_grouped_mlp_backward(dxp.data(), r.dw1.data(), r.dw2.data(), scratch.data(), dyp.data(),
                                xp.data(), h.data(), a.data(), p.w1.data(), p.w2.data(),
                                routing.offsets.data(), E, C, F, s.act);
  r.dx.resize(p.x.size());
  cpu::moe_permute_backward(r.dx.data(), dxp.data(), routing, C);
  cpu::moe_router_backward(dlogits.data(), dw.data(), dscores.data(), scores.data(), idx.data(), N,
                           E, k, s.score, s.renorm);
  // logits = x Wr^T: add the router's share of dx, accumulate dWr.
  std::vector<float> dx_router(p.x.size());
  r.dwr.assign(p.wr.size(), 0.0f);
  cpu::matmul_backward(dx_router.data(), r.dwr.data(), nullptr, dlogits.data(), p.x.data(),
                       p.wr.data(), N, C, E);
  for (size_t i = 0; i < r.dx.size(); ++i) r.dx[i] += dx_router[i];
  return r;
}

// The same layer in float64, straight from the definitions (no permutation at all).
double ref_layer_loss(const LayerShape& s, const Vec& x, const Vec& wr, const Vec& w1,
                      const Vec& w2, const Vec& gy, Vec* y_out = nullptr) {
  const int N = s.N, C = s.C, E = s.E, k = s.k;
  Vec logits((size_t)N * E, 0.0);
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e)
      for (int c = 0; c < C; ++c) logits[t * E + e] += x[t * C + c] * wr[e * C + c];
  const RefRouter r = ref_router(logits, N, E, k, s.score, s.renorm);
  const std::vector<bool> kept = ref_kept(r.idx, N, E, k, s.capacity());
  Vec y((size_t)N * C, 0.0);
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < k; ++j) {
      if (!kept[t * k + j]) continue;
      const Vec out = ref_expert(&x[t * C], w1, w2, r.idx[t * k + j], C, s.F, s.act);
      for (int c = 0; c < C; ++c) y[t * C + c] += r.w[t * k + j] * out[c];
    }
  if (y_out) *y_out = y;
  return loom::test::dot(y, gy) + ref_aux(r.scores, r.idx, N, E, k, s.aux_coeff);
}

// ---- router ---------------------------------------------------------------------------------

TEST(MoeRouter, ForwardMatchesReferenceAndBreaksTiesToLowerExpert) {
  const int N = 7, E = 6, k = 3;
  for (RouterScore sc : {RouterScore::Softmax, RouterScore::Sigmoid})
    for (bool renorm : {false, true}) {
      SCOPED_TRACE(
          loom::cat(sc == RouterScore::Softmax ? "softmax" : "sigmoid", " renorm ", renorm));
      std::vector<float> logits = random_floats(N * E, 11, -3.0f, 3.0f);
      // Row 0: a tie for second place (experts 1 and 4); row 1: all equal.
      logits[0] = 5.0f, logits[1] = 2.0f, logits[4] = 2.0f;
      for (int e = 0; e < E; ++e) logits[E + e] = 0.25f;
      std::vector<float> scores(N * E), w(N * k);
      std::vector<int32_t> idx(N * k);
      loom::cpu::moe_router_forward(scores.data(), idx.data(), w.data(), logits.data(), N, E, k, sc,
                                    renorm);
      const RefRouter ref = ref_router(to_f64(logits), N, E, k, sc, renorm);
      EXPECT_EQ(idx, ref.idx);
      EXPECT_TRUE(all_close(scores, ref.scores, 1e-6, 1e-5));
      EXPECT_TRUE(all_close(w, ref.w, 1e-6, 1e-5));
      EXPECT_EQ(idx[0], 0);
      EXPECT_EQ(idx[1], 1);
      EXPECT_EQ(idx[2], 4);
      EXPECT_EQ((std::vector<int32_t>(idx.begin() + k, idx.begin() + 2 * k)),
                (std::vector<int32_t>{0, 1, 2}));
      if (renorm) {
        EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
      }
    }
}

TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  const int N = 5, E = 5, k = 2;
  for (RouterScore sc : {RouterScore::Softmax, RouterScore::Sigmoid})
    for (bool renorm : {false, true}) {
      SCOPED_TRACE(
          loom::cat(sc == RouterScore::Softmax ? "softmax" : "sigmoid", " renorm ", renorm));
      const std::vector<float> logits = random_floats(N * E, 21, -2.0f, 2.0f);
      const std::vector<float> gw = random_floats(N * k, 22), gs = random_floats(N * E, 23);
      std::vector<float> scores(N * E), w(N * k), dlogits(N * E);
      std::vector<int32_t> idx(N * k);
      loom::cpu::moe_router_forward(scores.data(), idx.data(), w.data(), logits.data(), N, E, k, sc,
                                    renorm);
      loom::cpu::moe_router_backward(dlogits.data(), gw.data(), gs.data(), scores.data(),
                                     idx.data(), N, E, k, sc, renorm);
      const Vec g = numeric_gradient(
          [&](const Vec& l) {
            const RefRouter r = ref_router(l, N, E, k, sc, renorm);
            return loom::test::dot(r.w, to_f64(gw)) + loom::test::dot(r.scores, to_f64(gs));
          },
          to_f64(logits));
      EXPECT_TRUE(all_close(dlogits, g, 1e-5, 1e-4));
    }
}

TEST(MoeRouter, AuxLossValueAndGradient) {
  const int N = 9, E = 4, k = 2;
  const float coeff = 0.01f;
  for (RouterScore sc : {RouterScore::Softmax, RouterScore::Sigmoid}) {
    const std::vector<float> logits = random_floats(N * E, 31, -2.0f, 2.0f);
    std::vector<float> scores(N * E), w(N * k), dscores(N * E, 0.0f), dlogits(N * E);
    std::vector<int32_t> idx(N * k);
    loom::cpu::moe_router_forward(scores.data(), idx.data(), w.data(), logits.data(), N, E, k, sc,
                                  true);
    const double loss =
        loom::cpu::moe_aux_loss(dscores.data(), scores.data(), idx.data(), N, E, k, coeff, 1.0f);
    const RefRouter ref = ref_router(to_f64(logits), N, E, k, sc, true);
    EXPECT_NEAR(loss, ref_aux(ref.scores, ref.idx, N, E, k, coeff), 1e-8);
    const std::vector<float> zero(N * k, 0.0f);
    loom::cpu::moe_router_backward(dlogits.data(), zero.data(), dscores.data(), scores.data(),
                                   idx.data(), N, E, k, sc, true);
    const Vec g = numeric_gradient(
        [&](const Vec& l) {
          const RefRouter r = ref_router(l, N, E, k, sc, true);
          return ref_aux(r.scores, r.idx, N, E, k, coeff);
        },
        to_f64(logits));
    EXPECT_TRUE(all_close(dlogits, g, 1e-7, 1e-4));
  }
  // Perfect balance with uniform scores gives coeff * E * sum_e (1/E)(1/E) = coeff.
  std::vector<float> uniform(4 * 4, 0.25f);
  std::vector<int32_t> balanced = {0, 1, 2, 3};
  EXPECT_NEAR(loom::cpu::moe_aux_loss(nullptr, uniform.data(), balanced.data(), 4, 4, 1, 0.5f, 1.f),
              0.5, 1e-7);
}

// ---- routing, permute, unpermute -------------------------------------------------------------

TEST(MoeRouting, CapacityDropsByPositionOrder) {
  EXPECT_EQ(loom::cpu::moe_capacity(6, 2, 1, 1.0), 3);
  EXPECT_EQ(loom::cpu::moe_capacity(6, 2, 1, 0.5), 2);    // ceil(1.5)
  EXPECT_EQ(loom::cpu::moe_capacity(10, 4, 2, 1.25), 7);  // ceil(6.25)
  EXPECT_THROW(loom::cpu::moe_capacity(6, 2, 1, 0.0), loom::Error);

  const std::vector<int32_t> idx = {0, 0, 1, 0, 0, 1};  // k = 1
  MoeRouting r = loom::cpu::moe_plan_routing(idx.data(), 6, 2, 1, 2);
  EXPECT_EQ(r.counts, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(r.row_of, (std::vector<int32_t>{0, 1, 2, -1, -1, 3}));
  EXPECT_EQ(r.token_of, (std::vector<int32_t>{0, 1, 2, 5}));

  // k = 2: slots in token order; expert 2 overflows at token 2's second slot.
  const std::vector<int32_t> idx2 = {2, 0, 2, 1, 0, 2, 1, 2};
  r = loom::cpu::moe_plan_routing(idx2.data(), 4, 3, 2, 2);
  EXPECT_EQ(r.counts, (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(r.dropped, 2);  // expert 2's third and fourth assignments
  EXPECT_EQ(r.row_of, (std::vector<int32_t>{4, 0, 5, 2, 1, -1, 3, -1}));
  EXPECT_EQ(r.slot_of, (std::vector<int32_t>{1, 0, 1, 0, 0, 0}));

  // Dropless keeps everything; capacity 0 drops everything.
  r = loom::cpu::moe_plan_routing(idx2.data(), 4, 3, 2, -1);
  EXPECT_EQ(r.dropped, 0);
  EXPECT_EQ(r.counts, (std::vector<int32_t>{2, 2, 4}));
  r = loom::cpu::moe_plan_routing(idx2.data(), 4, 3, 2, 0);
  EXPECT_EQ(r.rows(), 0);
  EXPECT_EQ(r.dropped, 8);

  const std::vector<int32_t> bad = {0, 3};
  try {
    loom::cpu::moe_plan_routing(bad.data(), 2, 3, 1, -1);
    FAIL() << "expected an error";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 slot 0 has expert 3, outside [0, 3)"),
              std::string::npos)
        << e.what();
  }
}

// The Backend's routing plan is the MoeRouting in one int32 buffer (what a device keeps), and
// the group statistics form the same aux loss as moe_aux_loss.
TEST(MoeRouting, BackendPlanAndStatisticsMatchTheHostForms) {
  loom::Backend& be = loom::cpu_backend();
  const std::vector<int32_t> idx2 = {2, 0, 2, 1, 0, 2, 1, 2};
  const int N = 4, E = 3, k = 2;
  std::vector<int32_t> plan(size_t(loom::Backend::moe_plan_ints(N, E, k)), 77);
  be.moe_plan_routing(plan.data(), idx2.data(), N, E, k, 2);
  const MoeRouting r = loom::cpu::moe_plan_routing(idx2.data(), N, E, k, 2);
  EXPECT_EQ(std::vector<int32_t>(plan.begin(), plan.begin() + E), (std::vector<int32_t>{2, 2, 4}));
  EXPECT_EQ(std::vector<int32_t>(plan.begin() + E, plan.begin() + 2 * E), r.counts);
  EXPECT_EQ(std::vector<int32_t>(plan.begin() + 2 * E, plan.begin() + 3 * E + 1), r.offsets);
  const auto row_of = plan.begin() + 3 * E + 1;
  EXPECT_EQ(std::vector<int32_t>(row_of, row_of + N * k), r.row_of);
  EXPECT_EQ(std::vector<int32_t>(row_of + N * k, row_of + N * k + r.rows()), r.token_of);
  EXPECT_EQ(std::vector<int32_t>(row_of + N * k + r.rows(), plan.end()),
            std::vector<int32_t>(size_t(N * k - r.rows()), 0));

  const std::vector<float> scores = random_floats(size_t(N) * E, 41, 0.f, 1.f);
  std::vector<float> stats(2 * E + 1, -1.f);
  be.moe_expert_stats(stats.data(), scores.data(), idx2.data(), N, E, k);
  EXPECT_EQ(std::vector<float>(stats.begin(), stats.begin() + E), (std::vector<float>{2, 2, 4}));
  EXPECT_EQ(stats[2 * E], float(N));
  double loss = 0.0;
  for (int e = 0; e < E; ++e) {
    double sum = 0.0;
    for (int t = 0; t < N; ++t) sum += scores[size_t(t) * E + e];
    EXPECT_EQ(stats[size_t(E + e)], static_cast<float>(sum));
    loss += stats[size_t(e)] / (N * k) * (sum / N);
  }
  EXPECT_NEAR(be.moe_aux_loss(nullptr, scores.data(), idx2.data(), N, E, k, 0.5f, 0.f),
              0.5 * E * loss, 1e-12);
  std::vector<int32_t> bad = idx2;
  bad[5] = -1;
  EXPECT_THROW(be.moe_expert_stats(stats.data(), scores.data(), bad.data(), N, E, k), loom::Error);
  EXPECT_THROW(be.moe_plan_routing(plan.data(), bad.data(), N, E, k, -1), loom::Error);
}

// A token whose logits are NaN gets the first expert in slot 0 and none (-1, weight 0) in
// the later slots, without reading outside its scores; the routing names it.
TEST(MoeRouting, NanLogitsAreNamedByTheRouting) {
  const int N = 3, E = 4, k = 3;
  std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, NAN, NAN, NAN, NAN, 0.4f, 0.3f, 0.2f, 0.1f};
  std::vector<float> scores(N * E), w(N * k, 5.f);
  std::vector<int32_t> idx(N * k, 7);
  for (bool sig : {false, true}) {
    loom::cpu_backend().moe_router_forward(scores.data(), idx.data(), w.data(), logits.data(), N, E,
                                           k, sig, false);
    EXPECT_EQ(idx, (std::vector<int32_t>{3, 2, 1, 0, -1, -1, 0, 1, 2})) << "sigmoid " << sig;
    EXPECT_EQ(w[4], 0.f);
    EXPECT_EQ(w[5], 0.f);
    std::vector<int32_t> plan(size_t(loom::Backend::moe_plan_ints(N, E, k)));
    try {
      loom::cpu_backend().moe_plan_routing(plan.data(), idx.data(), N, E, k, -1);
      FAIL() << "expected an error";
    } catch (const loom::Error& e) {
      EXPECT_NE(std::string(e.what()).find("token 1 slot 1 has expert -1"), std::string::npos)
          << e.what();
    }
  }
}

TEST(MoePermute, RoundTripIsExact) {
  const int N = 37, C = 9, E = 5;
  const std::vector<float> x = random_floats(N * C, 41);
  for (int k : {1, 2, 3}) {
    std::vector<int32_t> idx(N * k);
    const std::vector<int32_t> pick = loom::test::random_ints(N * k, 42 + k, 0, E - 1);
    for (int t = 0; t < N; ++t)  // k distinct experts per token
      for (int j = 0; j < k; ++j) idx[t * k + j] = (pick[t * k] + j) % E;
    const MoeRouting r = loom::cpu::moe_plan_routing(idx.data(), N, E, k, -1);
    ASSERT_EQ(r.rows(), N * k);
    std::vector<float> xp(r.rows() * C), back(N * C);
    loom::cpu::moe_permute(xp.data(), x.data(), r, C);
    // Grouped: each row sits in its expert's range, and holds its token.
    for (int e = 0; e < E; ++e)
      for (int row = r.offsets[e]; row < r.offsets[e + 1]; ++row) {
        EXPECT_EQ(idx[r.token_of[row] * k + r.slot_of[row]], e);
        EXPECT_EQ(0, std::memcmp(&xp[row * C], &x[r.token_of[row] * C], C * sizeof(float)));
      }
    // Unpermute with weights 1 sums the k identical copies: k * x exactly (k <= 3 adds of
    // equal floats are exact for k = 1, 2; 3x can round, so compare with x + x + x).
    const std::vector<float> ones(N * k, 1.0f);
    loom::cpu::moe_unpermute(back.data(), xp.data(), ones.data(), r, C);
    for (int i = 0; i < N * C; ++i) {
      float want = 0.0f;
      for (int j = 0; j < k; ++j) want += x[i];
      ASSERT_EQ(back[i], want) << "k=" << k << " element " << i;
    }
    // permute_backward is the exact adjoint of permute: the same gather, transposed.
    loom::cpu::moe_permute_backward(back.data(), xp.data(), r, C);
    for (int i = 0; i < N * C; ++i) {
      float want = 0.0f;
      for (int j = 0; j < k; ++j) want += x[i];
      ASSERT_EQ(back[i], want);
    }
  }
}

TEST(MoePermute, BackwardsMatchFiniteDifferences) {
  const int N = 6, C = 4, E = 3, k = 2;
  const std::vector<int32_t> idx = {0, 1, 2, 0, 1, 2, 0, 2, 1, 0, 2, 1};
  const MoeRouting r = loom::cpu::moe_plan_routing(idx.data(), N, E, k, 3);  // drops some
  ASSERT_GT(r.dropped, 0);
  const int rows = r.rows();
  const std::vector<float> x = random_floats(N * C, 51), g = random_floats(rows * C, 52);
  const std::vector<float> ep = random_floats(rows * C, 53), w = random_floats(N * k, 54);
  const std::vector<float> gy = random_floats(N * C, 55);
  // Permute: L = <permute(x), g>.
  std::vector<float> dx(N * C);
  loom::cpu::moe_permute_backward(dx.data(), g.data(), r, C);
  auto permute_ref = [&](const Vec& xv) {
    double s = 0.0;
    for (int row = 0; row < rows; ++row)
      for (int c = 0; c < C; ++c) s += xv[r.token_of[row] * C + c] * g[row * C + c];
    return s;
  };
  EXPECT_TRUE(all_close(dx, numeric_gradient(permute_ref, to_f64(x)), 1e-6, 1e-5));
  // Unpermute: L = <unpermute(ep, w), gy>, gradient in ep and in w.
  std::vector<float> y(N * C), dep(rows * C), dw(N * k);
  loom::cpu::moe_unpermute(y.data(), ep.data(), w.data(), r, C);
  loom::cpu::moe_unpermute_backward(dep.data(), dw.data(), gy.data(), ep.data(), w.data(), r, C);
  auto unpermute_ref = [&](const Vec& e, const Vec& wv) {
    double s = 0.0;
    for (int t = 0; t < N; ++t)
      for (int j = 0; j < k; ++j) {
        const int row = r.row_of[t * k + j];
        if (row < 0) continue;
        for (int c = 0; c < C; ++c) s += wv[t * k + j] * e[row * C + c] * gy[t * C + c];
      }
    return s;
  };
  EXPECT_TRUE(all_close(
      dep, numeric_gradient([&](const Vec& e) { return unpermute_ref(e, to_f64(w)); }, to_f64(ep)),
      1e-6, 1e-5));
  EXPECT_TRUE(all_close(
      dw, numeric_gradient([&](const Vec& wv) { return unpermute_ref(to_f64(ep), wv); }, to_f64(w)),
      1e-6, 1e-5));
  for (int i = 0; i < N * k; ++i)
    if (r.row_of[i] < 0) {
      EXPECT_EQ(dw[i], 0.0f);
    }
}

// ---- grouped MLP ----------------------------------------------------------------------------

TEST(MoeGroupedMlp, ForwardAndBackwardMatchReference) {
  const int C = 6, F = 5, E = 4;
  const std::vector<int32_t> offsets = {0, 3, 3, 7, 8};  // expert 1 has no rows
  const int rows = offsets[E];
  for (MoeActivation act : {MoeActivation::GeLU, MoeActivation::SwiGLU}) {
    SCOPED_TRACE(act == MoeActivation::GeLU ? "gelu" : "swiglu");
    const int H = loom::cpu::moe_hidden_width(F, act);
    const std::vector<float> x = random_floats(rows * C, 61), w1 = random_floats(E * H * C, 62),
                             w2 = random_floats(E * C * F, 63), gy = random_floats(rows * C, 64);
    std::vector<float> y(rows * C), h(rows * H), a(rows * F), dx(rows * C), scratch(rows * (F + H));
    std::vector<float> dw1(w1.size(), 0.5f), dw2(w2.size(), -0.25f);  // accumulate onto these
    loom::cpu::moe_grouped_mlp_forward(y.data(), h.data(), a.data(), x.data(), w1.data(), w2.data(),
                                       offsets.data(), E, C, F, act);
    loom::cpu::moe_grouped_mlp_backward(dx.data(), dw1.data(), dw2.data(), scratch.data(),
                                        gy.data(), x.data(), h.data(), a.data(), w1.data(),
                                        w2.data(), offsets.data(), E, C, F, act);
    auto expert_of = [&](int row) {
      int e = 0;
      while (row >= offsets[e + 1]) ++e;
      return e;
    };
    auto forward = [&](const Vec& xv, const Vec& w1v, const Vec& w2v) {
      Vec out(rows * C);
      for (int row = 0; row < rows; ++row) {
        const Vec o = ref_expert(&xv[row * C], w1v, w2v, expert_of(row), C, F, act);
        for (int c = 0; c < C; ++c) out[row * C + c] = o[c];
      }
      return out;
    };
    EXPECT_TRUE(all_close(y, forward(to_f64(x), to_f64(w1), to_f64(w2)), 1e-5, 1e-4));
    auto loss = [&](const Vec& xv, const Vec& w1v, const Vec& w2v) {
      return loom::test::dot(forward(xv, w1v, w2v), to_f64(gy));
    };
    EXPECT_TRUE(all_close(
        dx,
        numeric_gradient([&](const Vec& v) { return loss(v, to_f64(w1), to_f64(w2)); }, to_f64(x)),
        1e-5, 1e-4));
    const Vec g1 =
        numeric_gradient([&](const Vec& v) { return loss(to_f64(x), v, to_f64(w2)); }, to_f64(w1));
    const Vec g2 =
        numeric_gradient([&](const Vec& v) { return loss(to_f64(x), to_f64(w1), v); }, to_f64(w2));
    Vec dw1_delta(dw1.size()), dw2_delta(dw2.size());
    for (size_t i = 0; i < dw1.size(); ++i) dw1_delta[i] = dw1[i] - 0.5;
    for (size_t i = 0; i < dw2.size(); ++i) dw2_delta[i] = dw2[i] + 0.25;
    EXPECT_TRUE(all_close(to_f32(dw1_delta), g1, 1e-5, 1e-4));
    EXPECT_TRUE(all_close(to_f32(dw2_delta), g2, 1e-5, 1e-4));
    // The empty expert's gradients stay untouched.
    for (int i = 0; i < H * C; ++i) EXPECT_EQ(dw1[1 * H * C + i], 0.5f);
  }
}

// ---- the whole layer -------------------------------------------------------------------------

void check_layer(const LayerShape& s, uint64_t seed, bool expect_drops) {
  const LayerParams p = random_params(s, seed);
  const LayerResult r = run_layer(s, p);
  if (expect_drops)
    EXPECT_GT(r.dropped, 0);
  else
    EXPECT_EQ(r.dropped, 0);
  Vec y_ref;
  const Vec x = to_f64(p.x), wr = to_f64(p.wr), w1 = to_f64(p.w1), w2 = to_f64(p.w2),
            gy = to_f64(p.gy);
  ref_layer_loss(s, x, wr, w1, w2, gy, &y_ref);
  EXPECT_TRUE(all_close(r.y, y_ref, 1e-5, 1e-4));
  const double tol_a = 2e-5, tol_r = 1e-3;
  EXPECT_TRUE(all_close(
      r.dx, numeric_gradient([&](const Vec& v) { return ref_layer_loss(s, v, wr, w1, w2, gy); }, x),
      tol_a, tol_r));
  EXPECT_TRUE(all_close(
      r.dwr,
      numeric_gradient([&](const Vec& v) { return ref_layer_loss(s, x, v, w1, w2, gy); }, wr),
      tol_a, tol_r));
  EXPECT_TRUE(all_close(
      r.dw1,
      numeric_gradient([&](const Vec& v) { return ref_layer_loss(s, x, wr, v, w2, gy); }, w1),
      tol_a, tol_r));
  EXPECT_TRUE(all_close(
      r.dw2,
      numeric_gradient([&](const Vec& v) { return ref_layer_loss(s, x, wr, w1, v, gy); }, w2),
      tol_a, tol_r));
}

TEST(MoeLayer, DroplessSoftmaxSwiGLUGradientCheck) {
  check_layer({10, 6, 4, 2, 5, RouterScore::Softmax, true, MoeActivation::SwiGLU, 0.0, 0.01f}, 71,
              false);
}

TEST(MoeLayer, CapacityDroppingSigmoidGeLUGradientCheck) {
  check_layer({12, 5, 4, 2, 4, RouterScore::Sigmoid, true, MoeActivation::GeLU, 0.75, 0.05f}, 81,
              true);
}

TEST(MoeLayer, TopOneWithoutRenormalisation) {
  check_layer({9, 4, 3, 1, 3, RouterScore::Softmax, false, MoeActivation::GeLU, 0.0, 0.1f}, 91,
              false);
}

TEST(MoeLayer, BitIdenticalOnOneAndTwoThreads) {
  const LayerShape s{600, 64,   8, 2, 96, RouterScore::Softmax, true, MoeActivation::SwiGLU,
                     1.0, 0.01f};
  const LayerParams p = random_params(s, 101);
  const int saved = loom::num_threads();
  loom::set_num_threads(1);
  const LayerResult one = run_layer(s, p);
  loom::set_num_threads(2);
  const LayerResult two = run_layer(s, p);
  loom::set_num_threads(saved);
  EXPECT_TRUE(loom::test::same_bits(one.y, two.y));
  EXPECT_TRUE(loom::test::same_bits(one.dx, two.dx));
  EXPECT_TRUE(loom::test::same_bits(one.dwr, two.dwr));
  EXPECT_TRUE(loom::test::same_bits(one.dw1, two.dw1));
  EXPECT_TRUE(loom::test::same_bits(one.dw2, two.dw2));
  EXPECT_EQ(one.aux, two.aux);
  EXPECT_EQ(one.dropped, two.dropped);
}

}  // namespace
