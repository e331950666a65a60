// `loom plan --search`: valid, fitting layouts ranked by throughput, with an explanation.
#include <gtest/gtest.h>

#include "plan/search.h"

using namespace loom::plan;

namespace {

SearchResult run(const char* model, int64_t nodes, int64_t gbs) {
  ClusterSpec c = cluster_preset("dgx-h100");
  c.nodes = nodes;
  TrainSpec base;
  base.global_batch = gbs;
  return search_layouts(model_preset(model), c, base);
}

}  // namespace

TEST(PlanSearch, RanksFittingLayoutsAndKeepsTensorParallelInsideANode) {
  SearchResult r = run("llama3-70b", 8, 128);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_GT(r.not_fitting, 0);  // e.g. tp 1 pp 1: 70B does not fit on one H100
  EXPECT_GT(r.invalid, 0);
  EXPECT_EQ(r.enumerated, r.invalid + r.not_fitting + int64_t(r.ranked.size()));
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    EXPECT_TRUE(r.ranked[i].memory.fits());
    if (i) {
      EXPECT_GE(r.ranked[i - 1].step.tokens_per_s, r.ranked[i].step.tokens_per_s);
    }
  }
  const Candidate& w = r.ranked.front();
  EXPECT_LE(w.train.tp, 8);
  EXPECT_EQ(w.step.tp_link, "nvlink");
  // Layouts with TP across nodes were considered and lost; the explanation says so.
  bool saw_cross_node = false;
  for (const Candidate& c : r.ranked) saw_cross_node |= c.train.tp > 8;
  EXPECT_TRUE(saw_cross_node);
  EXPECT_NE(r.explanation.find("winner: "), std::string::npos);
  EXPECT_NE(r.explanation.find("TP across nodes"), std::string::npos) << r.explanation;
  EXPECT_NE(r.explanation.find("exposed TP communication"), std::string::npos) << r.explanation;
}

TEST(PlanSearch, SmallModelNeedsNoModelParallelism) {
  SearchResult r = run("gpt2-124m", 1, 64);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.ranked.front().train.tp, 1);
  EXPECT_EQ(r.ranked.front().train.pp, 1);
}

TEST(PlanSearch, NothingFitsIsExplained) {
  SearchResult r = run("llama3-405b", 1, 8);
  EXPECT_TRUE(r.ranked.empty());
  EXPECT_GT(r.not_fitting, 0);
  EXPECT_NE(r.explanation.find("nothing fits"), std::string::npos) << r.explanation;
}
