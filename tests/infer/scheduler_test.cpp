// The continuous-batching scheduler simulated without a model: budgets, decode-first order,
// chunked prefill, preemption and recompute, prefix sharing, and no leaked blocks.
#include <gtest/gtest.h>

#include <memory>

#include "core/error.h"
#include "infer/scheduler.h"

using namespace loom::infer;

namespace {

KvSpec spec() {
  KvSpec s;
  s.n_layer = 1, s.n_kv_head = 1, s.head_dim = 4;
  return s;
}

std::unique_ptr<Sequence> seq(int64_t id, int prompt, int32_t first = 0) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  for (int i = 0; i < prompt; ++i) s->tokens.push_back(first + i);
  s->prompt_len = prompt;
  return s;
}

// A step as the engine runs it: every chunk that wants logits appends a token.
std::vector<ScheduledChunk> step(Scheduler& s) {
  auto chunks = s.schedule();
  s.after_step(chunks);
  for (auto& c : chunks)
    if (c.want_logits) c.seq->tokens.push_back(7);
  return chunks;
}

}  // namespace

TEST(Scheduler, DecodesFirstThenPrefillChunksWithinTheBudget) {
  KvCache cache(spec(), 4, 64);
  SchedulerConfig cfg;
  cfg.max_batched_tokens = 8;
  Scheduler s(cfg, cache);
  auto a = seq(1, 3), b = seq(2, 20);
  s.add(a.get());
  auto c1 = step(s);  // a prefills its 3 tokens
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c1[0].seq, a.get());
  EXPECT_EQ(c1[0].n, 3);
  EXPECT_TRUE(c1[0].want_logits);
  s.add(b.get());
  auto c2 = step(s);  // a decodes first, then b's first chunk of 7
  ASSERT_EQ(c2.size(), 2u);
  EXPECT_EQ(c2[0].seq, a.get());
  EXPECT_EQ(c2[0].n, 1);
  EXPECT_EQ(c2[1].seq, b.get());
  EXPECT_EQ(c2[1].n, 7);
  EXPECT_FALSE(c2[1].want_logits);
  int steps = 0;
  while (b->computed < 20) {  // a keeps decoding every step while b's prompt is chunked in
    auto c = step(s);
    EXPECT_EQ(c[0].seq, a.get());
    int total = 0;
    for (auto& x : c) total += x.n;
    EXPECT_LE(total, 8);
    ++steps;
  }
  EXPECT_EQ(steps, 2);  // 13 tokens left at 7 per step
  s.remove(a.get());
  s.remove(b.get());
  EXPECT_EQ(cache.num_used(), 0);
}

TEST(Scheduler, WithoutChunkingAPromptWaitsForRoomForAllOfIt) {
  KvCache cache(spec(), 4, 64);
  SchedulerConfig cfg;
  cfg.max_batched_tokens = 8;
  cfg.chunked_prefill = false;
  Scheduler s(cfg, cache);
  auto a = seq(1, 3), b = seq(2, 6);
  s.add(a.get());
  step(s);
  s.add(b.get());
  auto c = step(s);  // a's decode (1) leaves 7 >= 6: b runs whole
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].n, 6);
  auto big = seq(3, 30);
  s.add(big.get());
  c = step(s);  // 30 > budget and others are scheduled: it waits
  for (auto& x : c) EXPECT_NE(x.seq, big.get());
}

TEST(Scheduler, PreemptsTheNewestAndRecomputesItLater) {
  KvCache cache(spec(), 4, 6);  // 24 token slots
  SchedulerConfig cfg;
  cfg.max_batched_tokens = 64;
  Scheduler s(cfg, cache);
  auto a = seq(1, 10), b = seq(2, 10, 100);
  s.add(a.get());
  s.add(b.get());
  step(s);  // both prefill: 3 + 3 blocks, the pool is full
  EXPECT_EQ(cache.num_available(), 0);
  for (int i = 0; i < 2; ++i) step(s);  // 12 tokens each: still 3 blocks
  auto c = step(s);                     // both need a 4th block: b (newest) is preempted
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(b->computed, 0);
  EXPECT_TRUE(b->blocks.empty());
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq, a.get());
  s.remove(a.get());  // a leaves: b is recomputed from all of its tokens
  c = step(s);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq, b.get());
  EXPECT_EQ(c[0].start, 0);
  EXPECT_EQ(c[0].n, 13);  // its prompt and the 3 tokens it had generated
  s.remove(b.get());
  EXPECT_EQ(cache.num_used(), 0);
}

TEST(Scheduler, SharesCachedPrefixBlocks) {
  KvCache cache(spec(), 4, 32);
  Scheduler s(SchedulerConfig{}, cache);
  auto a = seq(1, 11);  // blocks [0..3] [4..7] full, [8..10] partial
  s.add(a.get());
  step(s);
  auto b = seq(2, 11);  // the same prompt
  s.add(b.get());
  auto c = step(s);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].seq, b.get());
  EXPECT_EQ(c[1].start, 8);  // two full blocks found in the cache
  EXPECT_EQ(b->cached_prompt_tokens, 8);
  EXPECT_EQ(b->blocks[0], a->blocks[0]);
  EXPECT_EQ(cache.refcount(a->blocks[0]), 2);
  s.remove(a.get());
  s.remove(b.get());
  EXPECT_EQ(cache.num_used(), 0);  // cached blocks stay findable but are free to reuse
  auto d = seq(3, 9);              // same first 8 tokens, found again after both left
  s.add(d.get());
  c = step(s);
  EXPECT_EQ(c[0].start, 8);
  s.remove(d.get());
}

// A destroyed cache's pool is the next same-size cache's (no new mapping, no page faults
// again), and only at its exact size: a cache of another size maps its own pool, which then
// replaces the spare. Reuse shows in the contents: a new mapping is zero-filled.
TEST(KvCache, PoolIsReusedByTheNextCacheOfItsSize) {
  KvCache::release_spare_pool();
  EXPECT_EQ(KvCache::spare_pool_bytes(), 0u);
  const void* first = nullptr;
  {
    KvCache a(spec(), 4, 64);
    first = a.view().k[0];
    static_cast<float*>(a.view().k[0])[0] = 3.0f;  // a written slot
  }
  const size_t bytes = KvCache::spare_pool_bytes();
  EXPECT_EQ(bytes, size_t(KvCache::bytes_per_block(spec(), 4)) * 64);
  {
    KvCache b(spec(), 4, 64);
    EXPECT_EQ(b.view().k[0], first);
    EXPECT_EQ(static_cast<const float*>(b.view().k[0])[0], 3.0f);
    EXPECT_EQ(KvCache::spare_pool_bytes(), 0u);  // taken
  }
  {
    KvCache c(spec(), 4, 32);  // another size: its own, zero-filled; the spare stays meanwhile
    EXPECT_EQ(static_cast<const float*>(c.view().k[0])[0], 0.0f);
    EXPECT_EQ(KvCache::spare_pool_bytes(), bytes);
  }
  EXPECT_EQ(KvCache::spare_pool_bytes(), bytes / 2);  // the last destroyed one's
  {
    KvCache d(spec(), 4, 64);
    EXPECT_EQ(static_cast<const float*>(d.view().k[0])[0], 0.0f);
  }
  KvCache::release_spare_pool();
  EXPECT_EQ(KvCache::spare_pool_bytes(), 0u);
}

// A decoding sequence's guesses are scheduled with its last token on blocks taken without
// preempting anyone (fewer guesses when the pool runs out), and accept_draft returns the blocks
// that held only rejected guesses.
TEST(Scheduler, GuessesRideAlongAndRejectedBlocksGoBack) {
  KvCache cache(spec(), 4, 4);
  SchedulerConfig cfg;
  Scheduler s(cfg, cache);
  auto a = seq(1, 3);
  s.add(a.get());
  step(s);  // prefill of 3 tokens, a fourth appended
  ASSERT_EQ(a->computed, 3);
  ASSERT_EQ(a->blocks.size(), 1u);
  a->draft = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  auto chunks = s.schedule();
  ASSERT_EQ(chunks.size(), 1u);
  // Position 3 plus guesses at 4 .. 15: the pool's 4 blocks hold 12 of the 13 guesses.
  EXPECT_EQ(chunks[0].draft, 12);
  EXPECT_EQ(chunks[0].n, 13);
  EXPECT_EQ(cache.num_used(), 4);
  s.after_step(chunks);
  EXPECT_EQ(a->computed, 4);  // the guesses are not computed until kept
  // Two guesses kept and the token after them: 7 tokens, positions 0 .. 5 computed.
  a->tokens.insert(a->tokens.end(), {1, 2, 9});
  s.accept_draft(a.get(), 2);
  EXPECT_EQ(a->computed, 6);
  EXPECT_EQ(a->blocks.size(), 2u);
  EXPECT_EQ(cache.num_used(), 2);
  EXPECT_THROW(s.accept_draft(a.get(), 1), loom::Error);  // nothing left to accept
  s.remove(a.get());
  EXPECT_EQ(cache.num_used(), 0);
}
