#include "infer/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace loom::infer {

Scheduler::Scheduler(const SchedulerConfig& cfg, KvCache& cache) : cfg_(cfg), cache_(cache) {
  LOOM_CHECK(cfg.max_num_seqs > 0 && cfg.max_batched_tokens > 0,
             "scheduler: max_num_seqs and max_batched_tokens must be positive");
}

void Scheduler::add(Sequence* s) {
  LOOM_CHECK(!s->tokens.empty(), "a sequence without tokens");
  waiting_.push_back(s);
}

void Scheduler::release_blocks(Sequence* s) {
  for (int32_t b : s->blocks) cache_.release(b);
  s->blocks.clear();
  s->computed = 0;
  s->hashed_blocks = 0;
  s->last_hash = 0;
}

void Scheduler::preempt(Sequence* s) {
  release_blocks(s);
  running_.erase(std::find(running_.begin(), running_.end(), s));
  waiting_.push_front(s);  // recomputed before anything newer
  ++s->preemptions;
  ++preemptions_;
}

void Scheduler::remove(Sequence* s) {
  release_blocks(s);
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
}

// Takes the cached blocks of the longest cached prefix of full blocks, leaving at least the
// last token to compute.
void Scheduler::admit_prefix(Sequence* s) {
  if (!cfg_.prefix_caching) return;
  const int bs = cache_.block_size();
  const int full = (static_cast<int>(s->tokens.size()) - 1) / bs;
  while (s->hashed_blocks < full) {
    const int32_t* t = s->tokens.data() + int64_t(s->hashed_blocks) * bs;
    const uint64_t h = KvCache::block_hash(s->last_hash, t, bs);
    const int32_t b = cache_.lookup(h, t);
    if (b < 0) break;
    s->blocks.push_back(b);
    s->last_hash = h;
    ++s->hashed_blocks;
  }
  s->computed = s->hashed_blocks * bs;
  if (!s->admitted_once) {
    s->cached_prompt_tokens = std::min(s->computed, s->prompt_len);
    cached_tokens_ += s->cached_prompt_tokens;
  }
  s->admitted_once = true;
}

// Blocks for positions [0, upto) of s, preempting the newest running sequences (not those
// already scheduled this step) when the pool runs out. False when s itself had to give way.
bool Scheduler::reserve(Sequence* s, int upto, std::vector<ScheduledChunk>& chunks) {
  const int bs = cache_.block_size();
  const int need = (upto + bs - 1) / bs;
  while (static_cast<int>(s->blocks.size()) < need) {
    const int32_t b = cache_.allocate();
    if (b >= 0) {
      s->blocks.push_back(b);
      continue;
    }
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      const bool scheduled = std::any_of(chunks.begin(), chunks.end(),
                                         [&](const ScheduledChunk& c) { return c.seq == *it; });
      if (!scheduled) {
        victim = *it;
        break;
      }
    }
    if (victim == nullptr || victim == s) return false;
    preempt(victim);
  }
  return true;
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> chunks;
  int budget = cfg_.max_batched_tokens;
  // 1. Decodes (exactly one token left to compute), oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    const int left = static_cast<int>(s->tokens.size()) - s->computed;
    if (left != 1) continue;
    if (!reserve(s, s->computed + 1, chunks)) {
      preempt(s);
      --i;
      continue;
    }
    // Guesses ride along while the budget and free blocks allow: they never preempt anyone.
    int d = std::min(static_cast<int>(s->draft.size()), budget - 1);
    const int bs = cache_.block_size();
    while (d > 0 && static_cast<int>(s->blocks.size()) * bs < s->computed + 1 + d) {
      const int32_t b = cache_.allocate();
      if (b < 0) {
        d = static_cast<int>(s->blocks.size()) * bs - s->computed - 1;
        break;
      }
      s->blocks.push_back(b);
    }
    chunks.push_back({s, s->computed, 1 + d, true, d});
    budget -= 1 + d;
  }
  // 2. Prefills: running sequences with a partly computed prompt, then new ones.
  auto prefill = [&](Sequence* s) -> bool {
    const int left = static_cast<int>(s->tokens.size()) - s->computed;
    int n = std::min(left, budget);
    if (!cfg_.chunked_prefill && n < left) {
      if (!chunks.empty()) return false;  // waits for a step with room for all of it
      n = left;                           // alone in its step: it must run some time
    }
    if (n <= 0) return false;
    if (!reserve(s, s->computed + n, chunks)) return false;
    chunks.push_back({s, s->computed, n, s->computed + n == static_cast<int>(s->tokens.size())});
    budget -= n;
    return true;
  };
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    if (static_cast<int>(s->tokens.size()) - s->computed <= 1) continue;
    if (std::any_of(chunks.begin(), chunks.end(),
                    [&](const ScheduledChunk& c) { return c.seq == s; }))
      continue;
    prefill(s);
  }
  while (budget > 0 && !waiting_.empty() && static_cast<int>(running_.size()) < cfg_.max_num_seqs) {
    Sequence* s = waiting_.front();
    admit_prefix(s);
    running_.push_back(s);
    waiting_.pop_front();
    if (!prefill(s)) {  // no room: back to the head of the queue, blocks returned
      running_.pop_back();
      release_blocks(s);
      waiting_.push_front(s);
      break;
    }
  }
  return chunks;
}

void Scheduler::after_step(const std::vector<ScheduledChunk>& chunks) {
  for (const ScheduledChunk& c : chunks) {
    Sequence* s = c.seq;
    s->computed = c.start + c.n - c.draft;
    publish_full_blocks(s);
  }
}

void Scheduler::publish_full_blocks(Sequence* s) {
  if (!cfg_.prefix_caching) return;
  const int bs = cache_.block_size();
  while ((s->hashed_blocks + 1) * bs <= s->computed) {
    const int32_t* t = s->tokens.data() + int64_t(s->hashed_blocks) * bs;
    const uint64_t h = KvCache::block_hash(s->last_hash, t, bs);
    cache_.publish(s->blocks[size_t(s->hashed_blocks)], h, t);
    s->last_hash = h;
    ++s->hashed_blocks;
  }
}

void Scheduler::accept_draft(Sequence* s, int accepted) {
  LOOM_CHECK(accepted >= 0 && s->computed + accepted < static_cast<int>(s->tokens.size()),
             "accept_draft: ", accepted, " guesses past ", s->computed, " computed of ",
             s->tokens.size(), " tokens");
  s->computed += accepted;
  publish_full_blocks(s);
  const int bs = cache_.block_size();
  const size_t keep = (s->tokens.size() + size_t(bs) - 1) / size_t(bs);
  while (s->blocks.size() > keep) {
    cache_.release(s->blocks.back());
    s->blocks.pop_back();
  }
}

}  // namespace loom::infer
