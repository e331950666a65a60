// argmax_first equals std::max_element for every row: ties (the lowest index wins), the maximum
// in the vectorised part or in the scalar tail, -0 against +0, infinities and NaNs anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "infer/argmax.h"

using loom::infer::argmax_first;

namespace {

int reference(const std::vector<float>& x) {
  return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
}

}  // namespace

TEST(Argmax, EqualsMaxElement) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int checked = 0;
  for (int n : {1, 15, 63, 64, 65, 127, 128, 200, 50304}) {
    for (int trial = 0; trial < 40; ++trial) {
      // Values from a small set, so that ties are common; one planted value at a varying place.
      std::vector<float> x(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i)
        x[size_t(i)] = std::floor(loom::uniform_at(uint64_t(n), uint64_t(trial), uint64_t(i)) * 8);
      const int at = static_cast<int>(loom::uniform_at(uint64_t(n), 1000 + uint64_t(trial), 0) * n);
      const float planted[] = {8.f, 7.f, -0.f, 0.f, inf, -inf, nan, 3.f};
      x[size_t(at)] = planted[trial % 8];
      if (trial % 5 == 4) std::fill(x.begin(), x.end(), -inf);  // all equal
      if (trial % 10 == 9) x[size_t(at)] = -0.f, x[size_t(n - 1)] = 0.f;
      ASSERT_EQ(argmax_first(x.data(), n), reference(x)) << "n " << n << " trial " << trial;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9 * 40);
}
