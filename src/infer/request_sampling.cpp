#include "infer/request_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "core/error.h"
#include "core/rng.h"
#include "infer/argmax.h"
#include "infer/constrain/token_constraint.h"

namespace loom::infer {

void validate(const SamplingParams& p, int vocab) {
  LOOM_CHECK(std::isfinite(p.temperature) && p.temperature >= 0 && p.temperature <= 100,
             "temperature must lie in [0, 100], got ", p.temperature);
  LOOM_CHECK(p.top_k >= 0, "top_k must be >= 0, got ", p.top_k);
  LOOM_CHECK(p.top_p > 0 && p.top_p <= 1, "top_p must lie in (0, 1], got ", p.top_p);
  LOOM_CHECK(p.min_p >= 0 && p.min_p <= 1, "min_p must lie in [0, 1], got ", p.min_p);
  LOOM_CHECK(p.repetition_penalty > 0 && p.repetition_penalty <= 10,
             "repetition_penalty must lie in (0, 10], got ", p.repetition_penalty);
  LOOM_CHECK(std::fabs(p.presence_penalty) <= 2, "presence_penalty must lie in [-2, 2], got ",
             p.presence_penalty);
  LOOM_CHECK(std::fabs(p.frequency_penalty) <= 2, "frequency_penalty must lie in [-2, 2], got ",
             p.frequency_penalty);
  LOOM_CHECK(p.max_tokens >= 0, "max_tokens must be >= 0, got ", p.max_tokens);
  LOOM_CHECK(p.n >= 1 && p.n <= 128, "n must lie in [1, 128], got ", p.n);
  LOOM_CHECK(p.logprobs >= -1 && p.logprobs <= 20, "logprobs must lie in [0, 20], got ",
             p.logprobs);
  LOOM_CHECK(p.stop.size() <= 16, "at most 16 stop strings, got ", p.stop.size());
  for (const auto& s : p.stop) LOOM_CHECK(!s.empty(), "a stop string must not be empty");
  LOOM_CHECK(!(p.constraint && p.ignore_eos),
             "ignore_eos cannot be combined with a structured-output constraint (it ends only "
             "when the output is complete)");
  LOOM_CHECK(!p.constraint || p.constraint->vocab_size() <= vocab, "the constraint's vocabulary (",
             p.constraint ? p.constraint->vocab_size() : 0, " tokens) is larger than the model's (",
             vocab, ")");
  for (auto [t, b] : p.logit_bias) {
    LOOM_CHECK(t >= 0 && t < vocab, "logit_bias token id ", t, " outside the vocabulary [0, ",
               vocab, ")");
    LOOM_CHECK(std::isfinite(b) && std::fabs(b) <= 100, "logit_bias of token ", t,
               " must lie in [-100, 100], got ", b);
  }
  for (int32_t t : p.stop_token_ids)
    LOOM_CHECK(t >= 0 && t < vocab, "stop token id ", t, " outside the vocabulary [0, ", vocab,
               ")");
}

SampledToken sample(float* x, int V, const SamplingParams& p, const std::vector<int32_t>& seen,
                    int prompt_len, uint64_t seed, uint64_t stream, uint64_t draw,
                    const uint64_t* allowed) {
  SampledToken out;
  // The raw logits' log-sum-exp, for the reported log-probabilities: only when they are asked
  // for (a pass of exp over the whole vocabulary cost greedy decode 3-6% of its token time).
  // With logprobs_at_temperature, of the logits / temperature.
  std::vector<float> raw;
  double lse = 0;
  const double t = p.logprobs_at_temperature && p.temperature > 0 ? double(p.temperature) : 1.0;
  if (p.logprobs >= 0) {
    raw.assign(x, x + V);
    const double mx = double(x[argmax_first(x, V)]) / t;
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(double(x[j]) / t - mx);
    lse = mx + std::log(z);
  }
  auto logprob = [&](int j) { return static_cast<float>(double(x[j]) / t - lse); };
  if (allowed)
    for (int base = 0; base < V; base += 64) {
      const uint64_t bits = allowed[base / 64];
      const int n = std::min(64, V - base);
      if (bits == ~uint64_t(0)) continue;  // a word of allowed tokens: nothing to mask
      if (bits == 0) {
        std::fill_n(x + base, n, -std::numeric_limits<float>::infinity());
        continue;
      }
      for (int k = 0; k < n; ++k)
        if (!((bits >> k) & 1)) x[base + k] = -std::numeric_limits<float>::infinity();
    }

  for (auto [t, b] : p.logit_bias) x[t] += b;
  // Penalties.
  if (p.repetition_penalty != 1.f) {
    std::vector<bool> hit(static_cast<size_t>(V), false);
    for (int32_t t : seen) hit[size_t(t)] = true;
    for (int j = 0; j < V; ++j)
      if (hit[size_t(j)])
        x[j] = x[j] > 0 ? x[j] / p.repetition_penalty : x[j] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    std::unordered_map<int32_t, int> count;
    for (size_t i = size_t(prompt_len); i < seen.size(); ++i) ++count[seen[i]];
    for (auto [t, c] : count) x[t] -= p.presence_penalty + p.frequency_penalty * float(c);
  }

  int chosen;
  if (p.temperature == 0) {
    chosen = argmax_first(x, V);  // lowest id on ties
  } else if (p.top_k == 0 && p.top_p >= 1 && p.min_p == 0) {
    // No filter: one pass over the vocabulary in id order, no sort (O(V) per token).
    // Each weight's exp computed once and kept (the search for the draw used to repeat it).
    const float top = x[argmax_first(x, V)];
    std::vector<double> w(static_cast<size_t>(V));
    double total = 0;
    for (int j = 0; j < V; ++j)
      total += w[size_t(j)] = std::exp((double(x[j]) - top) / p.temperature);
    double u = uniform_at(seed, stream, draw) * total;
    chosen = V - 1;
    for (int j = 0; j < V; ++j)
      if ((u -= w[size_t(j)]) < 0) {
        chosen = j;
        break;
      }
  } else {
    std::vector<int> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    const int k = p.top_k > 0 ? std::min(p.top_k, V) : V;
    auto cmp = [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
    idx.resize(size_t(k));
    std::vector<double> w(static_cast<size_t>(k));
    const double top = x[idx[0]];
    double sum = 0;
    for (int i = 0; i < k; ++i)
      sum += w[size_t(i)] = std::exp((x[idx[size_t(i)]] - top) / p.temperature);
    int keep = k;
    if (p.top_p < 1) {  // nucleus: the smallest prefix reaching top_p
      double acc = 0;
      for (int i = 0; i < k; ++i)
        if ((acc += w[size_t(i)] / sum) >= p.top_p) {
          keep = i + 1;
          break;
        }
    }
    if (p.min_p > 0) {  // min-p: tokens at least min_p times as likely as the most likely
      int m = 1;
      while (m < keep && w[size_t(m)] >= p.min_p * w[0]) ++m;
      keep = m;
    }
    const double total = std::accumulate(w.begin(), w.begin() + keep, 0.0);
    double u = uniform_at(seed, stream, draw) * total;
    chosen = idx[size_t(keep - 1)];
    for (int i = 0; i < keep; ++i)
      if ((u -= w[size_t(i)]) < 0) {
        chosen = idx[size_t(i)];
        break;
      }
  }
  out.token = chosen;
  if (p.logprobs >= 0) {
    std::copy(raw.begin(), raw.end(), x);
    out.logprob = logprob(chosen);
    const int k = std::min(p.logprobs, V);
    std::vector<int> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int i = 0; i < k; ++i) out.top.push_back({idx[size_t(i)], logprob(idx[size_t(i)])});
  }
  return out;
}

}  // namespace loom::infer
