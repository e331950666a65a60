// The serving engine: requests in, token events out, continuous batching over a paged KV cache
// (scheduler.h) driving a ModelRunner. One thread runs steps (start()), or the caller drives it
// (step() / run_until_idle(): batch generation, tests). submit() and cancel() may be called from
// any thread; events are delivered on the stepping thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "infer/draft_model.h"
#include "infer/engine_api.h"
#include "infer/kv_cache.h"
#include "infer/scheduler.h"
#include "infer/speculative.h"

namespace loom::infer {

struct EngineConfig {
  SchedulerConfig scheduler;
  int block_size = 16;
  int64_t kv_cache_bytes = int64_t(256) << 20;  // the pool's size, unless num_blocks is set
  int num_blocks = 0;
  // What the pool stores (kv_cache.h): a narrower type buys more blocks of kv_cache_bytes.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;
  int max_queue = 1024;          // requests waiting or running; more are refused (429)
  std::vector<int32_t> eos_ids;  // end of text / end of turn: finish with "stop"
  // Text of a list of ids (the tokenizer's decode); empty function: no text, no stop strings.
  std::function<std::string(const std::vector<int32_t>&)> detokenize;
  uint64_t seed = 0;  // streams of requests without a seed
  // Speculative decoding (speculative.h); method None: off. Needs a runner that scores many
  // rows of a chunk (ModelRunner::scores_many_rows).
  SpeculativeConfig speculative;
};

class LoomEngine : public Engine {
 public:
  // draft: speculative decoding's draft model (cfg.speculative.method Draft, which needs one;
  // the same vocabulary as runner's), whose own KV pool holds as many blocks as the target's
  // plus one per sequence.
  LoomEngine(ModelRunner& runner, const EngineConfig& cfg, ModelRunner* draft = nullptr);
  ~LoomEngine() override;

  int64_t submit(std::vector<int32_t> prompt, const SamplingParams& params,
                 std::function<void(const TokenEvent&)> on_event) override;
  void cancel(int64_t request_id) override;
  // Run on the stepping thread before the next step's forward (the runner's buffers are not
  // shared with a step); counted in in_flight() and the queue bound.
  void submit_embeddings(std::vector<std::vector<int32_t>> inputs, const EmbeddingOptions& opt,
                         std::function<void(const EmbeddingResult&)> done) override;
  EngineStats stats() const override;

  void start();  // a thread runs steps until stop()
  // Stops taking requests, lets those in flight finish for up to drain_seconds, cancels the
  // rest, joins the thread.
  void stop(double drain_seconds = 0);
  bool step();  // one step; false when there was nothing to do
  // For a caller that drives step() itself (tensor-parallel serving: steps on the MPI thread):
  // stop taking requests (submit refuses with 503), and how many are still open.
  void refuse_new() { accepting_ = false; }
  int64_t in_flight() const { return in_flight_.load(); }
  // The model's weights changed: cached prefixes are stale. Call on the stepping thread (or
  // with no thread running), between steps.
  void weights_updated() { cache_.drop_cached(); }
  void run_until_idle();
  const KvCache& cache() const { return cache_; }
  const DraftModel* draft() const { return draft_.get(); }

 private:
  struct Completion;
  struct Request;
  struct EmbeddingJob {
    std::vector<std::vector<int32_t>> inputs;
    EmbeddingOptions opt;
    std::function<void(const EmbeddingResult&)> done;
  };
  bool run_embeddings();  // the queued embedding jobs; false when there were none
  void take_inbox();
  void abort_all();
  void finish(Completion& c, const std::string& reason);
  void emit(Completion& c, const std::vector<int32_t>& new_tokens,
            const std::vector<float>& logprobs,
            const std::vector<std::vector<std::pair<int32_t, float>>>& top, bool finished,
            const std::string& reason);
  bool is_stop_token(const Completion& c, int32_t t) const;
  void propose_drafts();

  ModelRunner& runner_;
  EngineConfig cfg_;
  KvCache cache_;
  Scheduler scheduler_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<int64_t> cancels_;
  std::vector<EmbeddingJob> embed_inbox_;
  std::map<int64_t, std::unique_ptr<Request>> requests_;  // owned by the stepping thread
  std::atomic<int64_t> next_id_{1};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> accepting_{true}, stopping_{false};
  std::thread thread_;
  EngineStats stats_;  // guarded by mu_
  std::vector<float> logits_;
  std::vector<uint64_t> mask_;  // a structured output's allowed tokens, this step
  std::unique_ptr<DraftModel> draft_;
};

}  // namespace loom::infer
