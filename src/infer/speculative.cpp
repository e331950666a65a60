#include "infer/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace loom::infer {

SpeculativeMethod speculative_method_from_name(const std::string& name) {
  if (name.empty() || name == "none") return SpeculativeMethod::None;
  if (name == "ngram") return SpeculativeMethod::Ngram;
  if (name == "draft") return SpeculativeMethod::Draft;
  fail("speculative method '", name, "' is not one of: none, ngram, draft");
}

const char* speculative_method_name(SpeculativeMethod m) {
  return m == SpeculativeMethod::Ngram ? "ngram" : m == SpeculativeMethod::Draft ? "draft" : "none";
}

void validate(const SpeculativeConfig& c) {
  if (c.method == SpeculativeMethod::None) return;
  LOOM_CHECK(c.num_speculative_tokens >= 1 && c.num_speculative_tokens <= 64,
             "num_speculative_tokens must lie in [1, 64], got ", c.num_speculative_tokens);
  LOOM_CHECK(c.prompt_lookup_min >= 1, "prompt_lookup_min must be >= 1, got ", c.prompt_lookup_min);
  LOOM_CHECK(c.prompt_lookup_max >= c.prompt_lookup_min && c.prompt_lookup_max <= 64,
             "prompt_lookup_max must lie in [prompt_lookup_min = ", c.prompt_lookup_min,
             ", 64], got ", c.prompt_lookup_max);
}

std::vector<int32_t> ngram_propose(const std::vector<int32_t>& tokens, int min_n, int max_n,
                                   int k) {
  const int len = static_cast<int>(tokens.size());
  for (int n = std::min(max_n, len - 1); n >= min_n; --n) {
    const int32_t* suffix = tokens.data() + (len - n);
    // The latest occurrence that ends before the suffix starts to overlap its own end.
    for (int i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix, suffix + n, tokens.data() + i)) continue;
      const int from = i + n, to = std::min(len, from + k);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

int32_t speculative_verify(const std::vector<double>& p, const std::vector<double>& q, int32_t d,
                           double u_accept, double u_residual, bool& accepted) {
  LOOM_CHECK(p.size() == q.size() && d >= 0 && size_t(d) < p.size(),
             "speculative_verify: distributions of ", p.size(), " and ", q.size(),
             " tokens, guess ", d);
  accepted = q[size_t(d)] <= p[size_t(d)] || u_accept * q[size_t(d)] < p[size_t(d)];
  if (accepted) return d;
  double total = 0;
  for (size_t j = 0; j < p.size(); ++j) total += std::max(0.0, p[j] - q[j]);
  double u = u_residual * total;
  int32_t last = d;
  for (size_t j = 0; j < p.size(); ++j) {
    const double r = std::max(0.0, p[j] - q[j]);
    if (r <= 0) continue;
    last = static_cast<int32_t>(j);
    if ((u -= r) < 0) return last;
  }
  return last;  // rounding left u just above zero: the last token with residual mass
}

}  // namespace loom::infer
