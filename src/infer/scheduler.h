// Continuous batching over the paged KV cache, as plain data (simulated and tested without a
// model, like parallel/schedule/). Every step:
//   1. running sequences that decode (one new token each) are batched first, oldest first;
//   2. the rest of the token budget (max_batched_tokens) goes to prefill chunks: sequences whose
//      prompt is partly computed, then new sequences first come, first served (at most
//      max_num_seqs sequences hold blocks), so a long prompt never stalls running decodes for
//      more than one chunk;
//   3. when a sequence needs a block and none is left, the newest running sequence is preempted:
//      its blocks are released and it waits at the head of the queue to be recomputed from its
//      tokens (prompt and what it generated so far), so the answer does not change.
// With prefix caching a new sequence first takes the cached blocks of its prompt's longest
// cached prefix of full blocks (at least its last token is always computed, for its logits).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "infer/kv_cache.h"

namespace loom::infer {

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_batched_tokens = 512;
  bool chunked_prefill = true;  // off: a prompt is computed in one step when it fits the budget
  bool prefix_caching = true;
};

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then what was generated
  int prompt_len = 0;
  int computed = 0;  // leading tokens whose keys and values are in the cache
  std::vector<int32_t> blocks;
  int hashed_blocks = 0;  // leading full blocks published to the prefix cache
  uint64_t last_hash = 0;
  int cached_prompt_tokens = 0;  // prompt tokens found in the prefix cache on first admission
  bool admitted_once = false;
  int preemptions = 0;
  void* owner = nullptr;  // whoever scheduled it (the engine's completion)
  // Speculative guesses of the tokens after `tokens`, set before schedule(): a decoding
  // sequence computes them with its last token when the budget and free blocks allow.
  std::vector<int32_t> draft;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int start = 0, n = 0;  // tokens [start, start + n) computed this step
  bool want_logits = false;
  int draft = 0;  // the last `draft` of the n tokens are guesses (seq->draft), not seq->tokens
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, KvCache& cache);
  void add(Sequence* s);  // joins the waiting queue
  // The next step's chunks (empty when there is nothing to run). Blocks are reserved.
  std::vector<ScheduledChunk> schedule();
  // After the model ran the chunks: marks their tokens computed, publishes full blocks.
  void after_step(const std::vector<ScheduledChunk>& chunks);
  // After a verification chunk: `accepted` of its guesses joined seq->tokens (with the token
  // that followed them); their positions count as computed, full blocks are published, and the
  // blocks that only held rejected guesses go back to the pool.
  void accept_draft(Sequence* s, int accepted);
  // A sequence leaves (finished or cancelled): its blocks are released at once.
  void remove(Sequence* s);
  bool empty() const { return waiting_.empty() && running_.empty(); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int64_t preemptions() const { return preemptions_; }
  // Prompt tokens taken from the prefix cache, summed over sequences' first admissions (what
  // their usage reports as cached; a preempted sequence's re-admission is recompute, not a hit).
  int64_t cached_tokens() const { return cached_tokens_; }
  const SchedulerConfig& config() const { return cfg_; }

 private:
  bool reserve(Sequence* s, int upto, std::vector<ScheduledChunk>& chunks);
  void preempt(Sequence* s);
  void admit_prefix(Sequence* s);
  void release_blocks(Sequence* s);
  void publish_full_blocks(Sequence* s);
  SchedulerConfig cfg_;
  KvCache& cache_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order: the last is the newest
  int64_t preemptions_ = 0;
  int64_t cached_tokens_ = 0;
};

}  // namespace loom::infer
