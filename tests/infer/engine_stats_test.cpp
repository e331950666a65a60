// The engine's counters: EngineStats::cached_tokens_total counts the prompt tokens taken from the
// prefix cache, the same tokens every completion's usage reports as cached.
#include <gtest/gtest.h>

#include <map>

#include "infer/engine.h"
#include "infer/model_runner.h"
#include "model/decoder.h"

#include "infer_test_util.h"

using namespace loom;
using namespace loom::infer;
using loom::infer::test::greedy;
using loom::infer::test::prompt;
using loom::infer::test::tiny;

namespace {

// Runs the prompts one after another (each finds the blocks the earlier ones left cached) and
// returns the sum of their usage's cached prompt tokens; `stats` receives the engine's counters.
int64_t run_one_at_a_time(DecoderRunner& runner, bool prefix_caching,
                          const std::vector<std::vector<int32_t>>& prompts, EngineStats* stats) {
  EngineConfig cfg;
  cfg.block_size = 8;
  cfg.num_blocks = 64;
  cfg.scheduler.prefix_caching = prefix_caching;
  LoomEngine e(runner, cfg);
  std::map<int64_t, Usage> usage;
  for (const auto& p : prompts) {
    e.submit(p, greedy(4), [&](const TokenEvent& ev) {
      if (ev.finished) usage[ev.request_id] = ev.usage;
    });
    e.run_until_idle();
  }
  EXPECT_EQ(usage.size(), prompts.size());
  int64_t cached = 0;
  for (const auto& [id, u] : usage) cached += u.cached_prompt_tokens;
  *stats = e.stats();
  return cached;
}

}  // namespace

TEST(EngineStats, CachedTokensTotalCountsPrefixCacheHits) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(5);
  DecoderRunner runner(m);
  const auto shared = prompt(20, 9);  // two full blocks of 8 shared, the rest computed
  const std::vector<std::vector<int32_t>> prompts = {shared, prompt(5, 2, shared),
                                                     prompt(9, 3, shared), prompt(7, 1)};
  EngineStats on, off;
  const int64_t usage_on = run_one_at_a_time(runner, true, prompts, &on);
  // The second and third prompts each find the shared prompt's two full blocks.
  EXPECT_EQ(usage_on, 32);
  EXPECT_EQ(on.cached_tokens_total, usage_on);
  // Computed prompt tokens exclude the cached ones.
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  EXPECT_EQ(on.prompt_tokens_total, prompt_tokens - usage_on);

  const int64_t usage_off = run_one_at_a_time(runner, false, prompts, &off);
  EXPECT_EQ(usage_off, 0);
  EXPECT_EQ(off.cached_tokens_total, 0);
  EXPECT_EQ(off.prompt_tokens_total, prompt_tokens);
}
