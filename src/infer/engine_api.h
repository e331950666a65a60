// The serving engine's contracts, fixed first so that the engine (infer/), the model runner
// (model side) and the HTTP server (serve/) are built against one set of types:
//
//   HTTP server --(Engine: submit / cancel / stats)--> engine --(ModelRunner: forward)--> model
//
// The engine owns the paged KV cache (blocks of `block_size` tokens from one pool), the
// continuous-batching scheduler, prefix caching and sampling. A model runner only runs a batch
// of sequence chunks against the cache the engine hands it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace loom {
struct Backend;
}

namespace loom::infer {

namespace constrain {
class TokenConstraint;
}

// ---- engine <-> model ------------------------------------------------------------------------

// Shape of the KV cache a model needs. The pool stores, per layer, keys and values as
// [num_blocks, block_size, n_kv_head, head_dim] in `dtype`: fp32, bf16, or F8E4M3 codes with a
// scale byte per (slot, head) row (kernels/cpu/kv_fp8.h). A runner reports its compute type;
// the engine's --kv-cache-dtype may store another (infer/kv_cache.h).
struct KvSpec {
  int n_layer = 0, n_kv_head = 0, head_dim = 0;
  DType dtype = DType::F32;
};

// The cache memory the engine owns: per layer, base pointers of the key and value pools (host
// memory, or buffers of the runner's cache_backend()).
// Element (block b, slot s, head h, dim d) of layer l's keys is at
//   k[l] + ((int64_t(b) * block_size + s) * n_kv_head + h) * head_dim + d   (in elements).
struct KvCacheView {
  KvSpec spec;
  int block_size = 16;
  int num_blocks = 0;
  std::vector<void*> k, v;  // [n_layer], element type spec.dtype
  // [n_layer] fp8 row scales, [num_blocks, block_size, n_kv_head] bytes each (empty otherwise).
  std::vector<uint8_t*> k_scale, v_scale;
};

// One sequence's work in a step: `n` new tokens (a prefill chunk, or 1 for a decode) at
// positions start_pos .. start_pos + n - 1. Positions below start_pos are already in the cache.
// The runner writes the new tokens' keys/values into the slots the block table gives (token at
// position p lives in block block_table[p / block_size], slot p % block_size) and attends to
// positions [0, start_pos + n) causally.
struct SeqChunk {
  const int32_t* tokens = nullptr;  // [n]
  int n = 0;
  int start_pos = 0;
  const int32_t* block_table = nullptr;  // covers at least start_pos + n positions
  int num_blocks = 0;
  bool want_logits = false;  // logits of the chunk's last token are needed (decode, last chunk)
  // With want_logits: logits of the chunk's last `logits_rows` tokens, in order (a speculative
  // verification scores its guesses). Only runners whose scores_many_rows() is true get > 1.
  int logits_rows = 1;
};

// Embeddings (infer/embeddings.h): how a sequence's final hidden states (the final norm's
// output, the head's input) become one vector.
enum class Pooling { Last, Mean };  // the last token's state, or the mean over every token

struct EmbeddingOptions {
  Pooling pooling = Pooling::Last;
  bool normalize = true;        // scaled to unit L2 norm (a zero vector stays zero)
  int max_batch_tokens = 4096;  // tokens per forward pass (inputs are packed up to it)
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int vocab() const = 0;
  virtual int max_seq() const = 0;  // longest sequence (prompt + completion) the model takes
  virtual KvSpec kv_spec() const = 0;
  // Where the KV cache's pool must live: a Backend whose memory the host cannot address (the
  // model runs on a GPU), or null for host memory (the CPU).
  virtual Backend* cache_backend() const { return nullptr; }
  // Whether forward() honours SeqChunk::logits_rows > 1 (speculative decoding needs it).
  virtual bool scores_many_rows() const { return false; }
  // Runs every chunk of the batch. logits: [sum of logits_rows of chunks with want_logits,
  // vocab], in batch order, fp32 (the log-softmax is the engine's business).
  virtual void forward(const std::vector<SeqChunk>& batch, const KvCacheView& cache,
                       float* logits) = 0;
  // Whether embed() is implemented (tensor-parallel serving's runner does not).
  virtual bool embeds() const { return false; }
  // One pooled vector per input (each non-empty, within max_seq(), ids in the vocabulary), in
  // order; a forward without the KV cache, so called between forward() calls, never beside one.
  virtual std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>>& inputs,
                                                const EmbeddingOptions& opt);
};

// ---- server <-> engine -----------------------------------------------------------------------

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off (divides positive logits of seen tokens)
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // OpenAI semantics
  int max_tokens = 16;
  std::vector<std::string> stop;        // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;  // besides the model's end-of-text token
  bool ignore_eos = false;
  std::optional<uint64_t> seed;  // same seed + same prompt = same text, any batch
  int n = 1;                     // completions per prompt
  int logprobs = -1;             // -1: none; k >= 0: sampled token + top-k alternatives
  // true (temperature > 0): the log-probabilities reported are those of the raw logits divided
  // by `temperature`, the distribution the draw is made from (RL's behaviour policy, as TRL
  // and verl take it); false: of the raw logits, as OpenAI and vLLM report them.
  bool logprobs_at_temperature = false;
  // Structured output (infer/constrain/): only tokens that keep the text in the constraint's
  // language are drawn, and end of text only where the text is complete.
  std::shared_ptr<const constrain::TokenConstraint> constraint;
  // Added to the raw logits of these tokens before penalties and sampling (OpenAI's
  // logit_bias); the reported logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

struct Usage {
  int prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0;
  // Speculative decoding: guesses the target kept and those it replaced (OpenAI's
  // completion_tokens_details.accepted_prediction_tokens / rejected_prediction_tokens).
  int accepted_draft_tokens = 0, rejected_draft_tokens = 0;
};

// One step of one completion, delivered to the submitter's callback (on the engine's thread:
// keep it short and never block in it).
struct TokenEvent {
  int64_t request_id = 0;
  int index = 0;                // which of the n completions
  std::vector<int32_t> tokens;  // tokens appended this step (may be empty at the end)
  std::string text;             // their text, held back while it may still become a stop string
  std::vector<float> logprobs;  // per token, when requested
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;  // per token, top-k
  bool finished = false;
  std::string finish_reason;  // "stop" | "length" | "abort" when finished
  Usage usage;                // of this completion, filled in the finished event
  int32_t stop_token = -1;    // the stop token that ended it (finish_reason "stop"), if any
};

struct EngineStats {
  int64_t requests_total = 0, requests_running = 0, requests_waiting = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  int64_t cached_tokens_total = 0;  // prompt tokens found in the prefix cache (usage's cached)
  int64_t preemptions_total = 0;
  // Speculative decoding (vLLM's spec_decode_num_drafts / _num_draft_tokens /
  // _num_accepted_tokens): verification passes with guesses, guesses, guesses kept.
  int64_t spec_drafts_total = 0, spec_draft_tokens_total = 0, spec_accepted_tokens_total = 0;
  int kv_blocks_total = 0, kv_blocks_used = 0;
  int kv_block_size = 0;                // tokens per block
  const char* kv_cache_dtype = "fp32";  // what the pool stores (--kv-cache-dtype's names)
};

// Thrown by Engine::submit: the request can never run (400), the queue is full (429), or the
// engine is shutting down (503).
struct RequestRejected {
  int http_status = 400;
  std::string message;
};

// What Engine::submit_embeddings delivers: one vector per input, or why there are none.
struct EmbeddingResult {
  std::vector<std::vector<float>> vectors;
  int prompt_tokens = 0;  // tokens of every input
  std::string error;      // non-empty: the engine failed or stopped before computing them
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Queues a request; `on_event` receives its tokens. Returns the request id. Throws
  // RequestRejected for a prompt that cannot fit (prompt + max_tokens > max_seq, or more blocks
  // than the pool holds), bad parameters, or a full queue.
  virtual int64_t submit(std::vector<int32_t> prompt, const SamplingParams& params,
                         std::function<void(const TokenEvent&)> on_event) = 0;
  // Cancels a request (client gone): its sequences leave at the next step and free their blocks;
  // a final event with finish_reason "abort" is delivered.
  virtual void cancel(int64_t request_id) = 0;
  // Queues embeddings of `inputs` (ModelRunner::embed); `done` is called once, on the engine's
  // thread. Throws RequestRejected for an input that cannot run (empty, longer than the
  // context, an id outside the vocabulary: 400, naming the input's index), a runner without
  // embeddings (400), a full queue (429) or shutdown (503).
  virtual void submit_embeddings(std::vector<std::vector<int32_t>> inputs,
                                 const EmbeddingOptions& opt,
                                 std::function<void(const EmbeddingResult&)> done) {
    (void)inputs, (void)opt, (void)done;
    throw RequestRejected{400, "this engine computes no embeddings"};
  }
  virtual EngineStats stats() const = 0;
};

}  // namespace loom::infer
