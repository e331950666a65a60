// Speculative decoding's draft model (SpeculativeMethod::Draft): a smaller model with the
// target's vocabulary proposes the next k tokens of every decoding sequence, k single-token
// steps of its own, each step one batched forward over every sequence. The draft keeps its own
// paged KV cache and block tables (no prefix sharing): per sequence, the tokens whose keys and
// values it holds, so that each step it computes only what the target accepted since (the
// tokens after the longest prefix it already holds, then its own guesses).
//
// The draft proposes its most likely token at each step: a one-hot draft distribution q, for
// which the rejection rule (speculative.h) keeps a guess d exactly when the target's own draw is
// d. The output then follows the target's distribution exactly, and for a given seed is the
// text plain decoding writes.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "infer/engine_api.h"
#include "infer/kv_cache.h"

namespace loom::infer {

class DraftModel {
 public:
  // The runner must score rows of its chunks (any ModelRunner does for want_logits);
  // num_blocks of block_size tokens make its pool.
  DraftModel(ModelRunner& runner, int block_size, int num_blocks);

  struct Job {
    int64_t seq = 0;                               // the sequence's id (its state between steps)
    const std::vector<int32_t>* tokens = nullptr;  // prompt and output so far
    int k = 0;                                     // guesses wanted
    std::vector<int32_t> guesses;                  // out: at most k (fewer when blocks run out)
  };
  // Fills every job's guesses.
  void propose(std::vector<Job>& jobs);
  // The sequence left: its blocks go back to the pool.
  void forget(int64_t seq);
  const KvCache& cache() const { return cache_; }
  int64_t forwards() const { return forwards_; }  // draft forward passes so far

 private:
  struct State {
    std::vector<int32_t> tokens;  // what the draft has seen: computed ones first
    int computed = 0;             // leading tokens whose keys and values are in its cache
    std::vector<int32_t> blocks;
    uint64_t used = 0;  // the last propose() that touched it (evicting the oldest first)
  };
  // Blocks for `positions` positions; false when the pool cannot give them even after
  // evicting states that this propose() call is not serving.
  bool reserve(State& s, int positions);
  void release(State& s);

  ModelRunner& runner_;
  KvCache cache_;
  std::unordered_map<int64_t, State> states_;
  uint64_t clock_ = 0;
  int64_t forwards_ = 0;
  std::vector<float> logits_;
};

}  // namespace loom::infer
