// Test helpers shared by the kernel tests (ops_test.cpp, attention_test.cpp): deterministic
// random inputs, float-vs-float64 comparison with a report of the worst element, and a
// central-difference gradient of any float64 function.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace loom::test {

using Vec = std::vector<double>;

// n floats uniform in [lo, hi), the same for the same seed.
inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(dist(gen));
  return v;
}

inline std::vector<int32_t> random_ints(size_t n, uint64_t seed, int32_t lo, int32_t hi_incl) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi_incl);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline Vec to_f64(const std::vector<float>& v) {
  return Vec(v.begin(), v.end());
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Gradient of f at x by central differences: df/dx_i ~ (f(x + h_i e_i) - f(x - h_i e_i)) / 2h_i
// with h_i = h * max(1, |x_i|). For float64 f the error is ~1e-9 relative, far below the
// float kernels' own error, so the result serves as the exact gradient.
inline Vec numeric_gradient(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    const double hi = h * std::max(1.0, std::abs(xi));
    x[i] = xi + hi;
    const double fp = f(x);
    x[i] = xi - hi;
    const double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2.0 * hi);
  }
  return g;
}

// Every |actual[i] - expected[i]| <= atol + rtol * |expected[i]|; on failure names the worst
// element, its values and how many elements failed. NaN in actual always fails.
template <typename T>
::testing::AssertionResult all_close(const T* actual, const Vec& expected, double atol,
                                     double rtol) {
  size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const double err = std::abs(a - e);
    const bool ok = a == e || err <= atol + rtol * std::abs(e);  // a == e: matching infinities
    if (!ok) {
      ++bad;
      const double excess = std::isnan(err) ? 1e300 : err / (atol + rtol * std::abs(e));
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << expected.size() << " elements differ; worst at [" << worst
         << "]: actual " << static_cast<double>(actual[worst]) << " expected " << expected[worst]
         << " (atol " << atol << ", rtol " << rtol << ")";
}

template <typename T>
::testing::AssertionResult all_close(const std::vector<T>& actual, const Vec& expected, double atol,
                                     double rtol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  return all_close(actual.data(), expected, atol, rtol);
}

// a - b elementwise, in float64 (for "parameter gradient accumulated onto its old value").
inline Vec minus(const std::vector<float>& a, const std::vector<float>& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = static_cast<double>(a[i]) - b[i];
  return d;
}

}  // namespace loom::test
