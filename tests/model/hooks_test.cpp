// The model's hooks take several subscribers (model/hooks.h): DP's gradient reduction, ZeRO-3's
// gathering and anything else listen to one Decoder side by side.
#include <gtest/gtest.h>

#include <vector>

#include "model/decoder.h"
#include "model/hooks.h"
#include "model/model_test_util.h"

using namespace loom;

TEST(Hook, SubscribersRunInOrderAndLeaveByIdOrAllAtOnce) {
  Hook<int> h;
  EXPECT_FALSE(h);
  // Each call is recorded as subscriber * 10 + argument.
  std::vector<int> seen;
  const int64_t a = h.subscribe([&](int x) { seen.push_back(10 + x); });
  h.subscribe([&](int x) { seen.push_back(20 + x); });
  EXPECT_TRUE(h);
  h(1);
  EXPECT_EQ(seen, (std::vector<int>{11, 21}));
  h.unsubscribe(a);
  h.unsubscribe(a);  // gone already: nothing
  h(2);
  EXPECT_EQ(seen, (std::vector<int>{11, 21, 22}));
  // Assignment (the single-subscriber form) replaces every subscriber; nullptr clears.
  h = [&](int x) { seen.push_back(30 + x); };
  h(3);
  EXPECT_EQ(seen, (std::vector<int>{11, 21, 22, 33}));
  EXPECT_EQ(h.size(), 1u);
  h = nullptr;
  EXPECT_FALSE(h);
  h(4);
  EXPECT_EQ(seen, (std::vector<int>{11, 21, 22, 33}));
}

// Two listeners on one model's hooks both see every call of a step, in the model's order.
TEST(Hook, DecoderCallsEverySubscriber) {
  ModelConfig c = test::tiny(Family::GPT2);
  Decoder m(c, cpu_backend());
  m.params().init(3);
  m.params().zero_grad();
  std::vector<int> grads_a, grads_b, blocks_a, blocks_b;
  m.on_grads_ready.subscribe([&](int l) { grads_a.push_back(l); });
  m.on_grads_ready.subscribe([&](int l) { grads_b.push_back(l); });
  m.before_block.subscribe([&](int l, bool bwd) { blocks_a.push_back(bwd ? -1 - l : l); });
  m.before_block.subscribe([&](int l, bool bwd) { blocks_b.push_back(bwd ? -1 - l : l); });
  test::Data d = test::make_data({5, 3}, c.vocab, 1);
  m.forward_backward(d.input(), 0.125f);
  const std::vector<int> want_grads = {1, 0, -1};
  EXPECT_EQ(grads_a, want_grads);
  EXPECT_EQ(grads_b, want_grads);
  const std::vector<int> want_blocks = {0, 1, -2, -1};  // forward 0, 1; backward 1, 0
  EXPECT_EQ(blocks_a, want_blocks);
  EXPECT_EQ(blocks_b, want_blocks);
}
