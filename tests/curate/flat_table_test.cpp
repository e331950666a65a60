// The reusable open-addressing table behind the filters' n-gram and line counting.
#include <gtest/gtest.h>

#include <string_view>
#include <vector>

#include "curate/flat_table.h"

using loom::curate::FlatTable;

TEST(FlatTable, CountsKeysAndResetEmptiesIt) {
  FlatTable t;
  t.reset(4);
  bool inserted;
  for (uint64_t k : {5ull, 7ull, 5ull, 0ull, 5ull}) ++t.find_or_insert(k, inserted).value;
  EXPECT_EQ(t.find_or_insert(5, inserted).value, 3u);
  EXPECT_FALSE(inserted);
  EXPECT_EQ(t.find_or_insert(0, inserted).value, 1u);  // key 0 is an ordinary key
  t.reset(4);
  EXPECT_EQ(t.find_or_insert(5, inserted).value, 0u);
  EXPECT_TRUE(inserted);
  // Growing past the first capacity keeps every key distinct.
  t.reset(10000);
  for (uint64_t k = 0; k < 10000; ++k) t.find_or_insert(k * 1024, inserted).value = 1;
  size_t fresh = 0;
  for (uint64_t k = 0; k < 10000; ++k) fresh += (t.find_or_insert(k * 1024, inserted), inserted);
  EXPECT_EQ(fresh, 0u);
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
