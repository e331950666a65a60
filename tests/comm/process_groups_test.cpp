// The rank generator alone (no MPI): Megatron's ordering and size validation.
#include <gtest/gtest.h>

#include <set>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"

using namespace loom;
using namespace loom::comm;

TEST(RankGenerator, TensorParallelIsFastestThenContextDataPipeline) {
  ParallelDims d;
  d.tp = 2;
  d.cp = 2;
  d.pp = 2;
  RankGenerator g(16, d);  // dp derived: 16 / 8 = 2
  EXPECT_EQ(g.dims().dp, 2);
  auto tp = g.groups("tp");
  ASSERT_EQ(tp.size(), 8u);
  EXPECT_EQ(tp[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(tp[1], (std::vector<int>{2, 3}));
  EXPECT_EQ(g.groups("cp")[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(g.groups("dp")[0], (std::vector<int>{0, 4}));
  EXPECT_EQ(g.groups("pp")[0], (std::vector<int>{0, 8}));
  EXPECT_EQ(g.groups("dp-cp")[1], (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(g.groups("tp-cp")[0], (std::vector<int>{0, 1, 2, 3}));
  RankCoords c = g.coords(13);  // 13 = 1 + 2*(0 + 2*(0 + 2*1)) + ... -> tp1 cp0 dp1 pp1
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(g.rank_of(c), 13);
  // Every group kind partitions the world.
  for (const char* kind : {"tp", "cp", "dp", "pp", "ep", "tp-dp", "tp-cp-dp-pp"}) {
    std::set<int> seen;
    for (auto& grp : g.groups(kind))
      for (int r : grp) EXPECT_TRUE(seen.insert(r).second) << kind;
    EXPECT_EQ(seen.size(), 16u) << kind;
  }
}

TEST(RankGenerator, ExpertParallelSplitsDataParallel) {
  ParallelDims d;
  d.tp = 2;
  d.ep = 2;
  RankGenerator g(8, d);  // dp = 4, ep = 2
  EXPECT_EQ(g.groups("ep")[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(g.groups("edp")[0], (std::vector<int>{0, 4}));
  EXPECT_EQ(g.groups("dp")[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(g.coords(6).ep, 1);
  EXPECT_EQ(g.coords(6).dp, 3);
}

TEST(RankGenerator, SizesThatDoNotDivideAreClearErrors) {
  ParallelDims d;
  d.tp = 4;
  try {
    RankGenerator g(6, d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by tp*cp*pp"), std::string::npos)
        << e.what();
  }
  d.tp = 2;
  d.dp = 2;
  try {
    RankGenerator g(6, d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not equal tp*cp*dp*pp"), std::string::npos)
        << e.what();
  }
  d.dp = 3;
  d.ep = 2;
  EXPECT_THROW(RankGenerator(6, d), Error);
  d.ep = 1;
  d.tp = 0;
  EXPECT_THROW(RankGenerator(6, d), Error);
  EXPECT_THROW(RankGenerator(4, ParallelDims{}).groups("xx"), Error);
}

TEST(SelfCommunicator, CollectivesAreCopies) {
  auto c = make_self_communicator();
  float x[3] = {1, 2, 3}, y[3] = {0, 0, 0};
  c->all_reduce(x, 3, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(x[2], 3.f);
  c->reduce_scatter(x, y, {3}, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(y[1], 2.f);
  EXPECT_THROW(c->send(x, 1, DType::F32, 1), Error);
}
