#include "rl/grpo.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::rl {

std::vector<double> group_advantages(const std::vector<double>& r, const GrpoConfig& c) {
  const size_t n = r.size();
  LOOM_CHECK(n > 0, "an empty group");
  double mean = 0;
  for (double x : r) mean += x / double(n);
  double var = 0;
  for (double x : r) var += (x - mean) * (x - mean);
  const double sd = n > 1 ? std::sqrt(var / double(n - 1)) : 0.0;  // unbiased, as torch.std
  std::vector<double> a(n);
  for (size_t i = 0; i < n; ++i)
    a[i] = c.scale_by_std ? (r[i] - mean) / (sd + c.std_eps) : r[i] - mean;
  return a;
}

GrpoTotals grpo_totals(const std::vector<GrpoSample>& samples) {
  GrpoTotals t;
  for (const auto& s : samples) {
    t.tokens += int64_t(s.logp.size());
    t.sequences += !s.logp.empty();
  }
  return t;
}

GrpoStats grpo_token_weights(const std::vector<GrpoSample>& samples, const GrpoConfig& c,
                             std::vector<std::vector<double>>* weights, const GrpoTotals* totals) {
  GrpoStats st;
  const GrpoTotals local = grpo_totals(samples);
  const GrpoTotals all = totals ? *totals : local;
  LOOM_CHECK(all.tokens >= local.tokens && all.sequences >= local.sequences, "GRPO totals of ",
             all.tokens, " tokens in ", all.sequences, " sequences below this share's ",
             local.tokens, " in ", local.sequences);
  const int64_t total = all.tokens;
  const size_t nonempty = size_t(all.sequences);
  if (weights) weights->assign(samples.size(), {});
  if (local.tokens == 0) {
    st.tokens = total;
    return st;
  }
  int64_t clipped = 0;
  double is_sum = 0;
  for (size_t k = 0; k < samples.size(); ++k) {
    const GrpoSample& s = samples[k];
    const size_t T = s.logp.size();
    LOOM_CHECK(s.logp_old.size() == T && (s.logp_ref.empty() || s.logp_ref.size() == T) &&
                   (s.logp_gen.empty() || s.logp_gen.size() == T),
               "GRPO sample ", k, ": log-probability arrays of different lengths");
    LOOM_CHECK(c.beta == 0 || !s.logp_ref.empty(), "GRPO with beta > 0 needs reference logps");
    if (weights) (*weights)[k].assign(T, 0.0);
    if (T == 0) continue;
    const double Z = c.token_level ? double(total) : double(T) * double(nonempty);
    const double A = s.advantage;
    for (size_t t = 0; t < T; ++t) {
      const double rho = std::exp(s.logp[t] - s.logp_old[t]);
      const double is =
          s.logp_gen.empty() ? 1.0 : std::min(std::exp(s.logp_old[t] - s.logp_gen[t]), c.is_cap);
      const double lo = 1 - c.eps_low, hi = 1 + c.eps_high;
      const double unclipped = rho * A, clipped_v = std::clamp(rho, lo, hi) * A;
      // min(): the clipped branch is taken (no gradient) when it is strictly smaller.
      const bool clip_active = clipped_v < unclipped;
      clipped += clip_active;
      is_sum += is;
      double j = std::min(unclipped, clipped_v) * is;
      double dj = clip_active ? 0.0 : rho * A * is;  // d/dlogp of rho A is rho A
      if (c.beta > 0) {
        const double d = s.logp_ref[t] - s.logp[t];
        const double k3 = std::exp(d) - d - 1;
        st.kl += k3 / double(total);
        j -= c.beta * k3;
        dj -= c.beta * (1 - std::exp(d));  // d k3 / d logp = 1 - exp(ref - logp)
      }
      st.loss -= j / Z;
      if (weights) (*weights)[k][t] = dj / Z;  // w = -dL/dlogp = dJ/dlogp / Z
    }
  }
  st.tokens = total;
  st.clip_fraction = double(clipped) / double(total);
  st.mean_is_weight = is_sum / double(total);
  return st;
}

void logprob_and_entropy(const float* logits, int V, int target, double* logp, double* entropy) {
  LOOM_CHECK(V > 0 && target >= 0 && target < V, "log-prob of token ", target,
             " over a vocabulary of ", V);
  double mx = -INFINITY;
  for (int v = 0; v < V; ++v) mx = std::max(mx, double(logits[v]));
  LOOM_CHECK(std::isfinite(mx), "non-finite logits (max ", mx, ")");
  double z = 0, zx = 0;  // sum e^(x - mx), sum e^(x - mx) (x - mx)
  for (int v = 0; v < V; ++v) {
    const double d = double(logits[v]) - mx, e = std::exp(d);
    z += e;
    zx += e * d;
  }
  const double lse = std::log(z);  // log-sum-exp - mx
  *logp = double(logits[target]) - mx - lse;
  *entropy = lse - zx / z;  // -sum p (x - mx - lse)
}

}  // namespace loom::rl
