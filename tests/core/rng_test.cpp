#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"

using namespace loom;

TEST(Rng, ValueDependsOnlyOnSeedKeyIndex) {
  uint64_t k = name_key("blocks.0.attn.qkv.weight");
  std::vector<float> whole(1000), part(300);
  fill_normal(whole.data(), 1000, 42, k, 0, 0.f, 1.f);
  fill_normal(part.data(), 300, 42, k, 500, 0.f, 1.f);  // a "shard" starting at element 500
  for (int i = 0; i < 300; ++i) EXPECT_EQ(part[i], whole[500 + i]);
  EXPECT_NE(normal_at(42, k, 0), normal_at(43, k, 0));
  EXPECT_NE(normal_at(42, k, 0), normal_at(42, name_key("other"), 0));
}

TEST(Rng, NormalHasUnitMoments) {
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = normal_at(7, 1, i);
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
  for (int i = 0; i < 1000; ++i) {
    float u = uniform_at(1, 2, i);
    EXPECT_GE(u, 0.f);
    EXPECT_LT(u, 1.f);
  }
}
