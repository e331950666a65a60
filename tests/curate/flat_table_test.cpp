// The reusable open-addressing table behind the filters' n-gram and line counting.
#include <gtest/gtest.h>

#include <string_view>
#include <vector>

#include "curate/flat_table.h"

using loom::curate::FlatTable;

TEST(FlatTable, AssignsFirstValuesAndResetEmptiesIt) {
  FlatTable t;
  t.reset(4);
  std::vector<uint32_t> got;
  uint32_t i = 0;
  for (uint64_t k : {5ull, 7ull, 5ull, 0ull, 5ull}) got.push_back(t.find_or_assign(k, i++));
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 0, 3, 0}));  // key 0 is an ordinary key
  t.reset(4);
  EXPECT_EQ(t.find_or_assign(5, 9), 9u);
  // Growing past the first capacity keeps every key distinct (keys that share their low bits
  // probe past each other).
  t.reset(10000);
  for (uint32_t k = 0; k < 10000; ++k) {
    t.prefetch(uint64_t{k} * 1024);
    ASSERT_EQ(t.find_or_assign(uint64_t{k} * 1024, k), k);
  }
  for (uint32_t k = 0; k < 10000; ++k) ASSERT_EQ(t.find_or_assign(uint64_t{k} * 1024, 0), k);
}

TEST(FlatTable, CheckedInsertKeepsCollidingElementsApart) {
  std::vector<std::string_view> xs = {"alpha", "beta", "alpha", "gamma"};
  FlatTable t;
  t.reset(xs.size());
  std::vector<bool> was_new;
  for (uint32_t i = 0; i < xs.size(); ++i) {
    bool inserted;
    // Every element gets the same hash: only the content comparison tells them apart.
    auto& s = t.find_or_insert_checked(
        42, i, [&](uint32_t j) { return xs[j] == xs[i]; }, inserted);
    was_new.push_back(inserted);
    if (!inserted) {
      EXPECT_EQ(xs[s.value], xs[i]);
    }
  }
  EXPECT_EQ(was_new, (std::vector<bool>{true, true, false, true}));
}
