#include "infer/engine.h"

#include <omp.h>

#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/utf8.h"
#include "infer/constrain/token_constraint.h"
#include "infer/decode_profile.h"
#include "infer/embeddings.h"
#include "infer/request_sampling.h"

namespace loom::infer {

struct LoomEngine::Completion {
  Request* request = nullptr;
  int index = 0;
  Sequence seq;
  int generated = 0;
  std::string text;  // decoded output so far
  int32_t stop_token = -1;
  size_t sent = 0;  // bytes of text already delivered
  bool done = false;
  int constraint_state = 0;  // the structured-output automaton's state after the output so far
  int accepted = 0, rejected = 0;  // speculative guesses kept and replaced
};

struct LoomEngine::Request {
  int64_t id = 0;
  SamplingParams params;
  std::function<void(const TokenEvent&)> on_event;
  std::vector<std::unique_ptr<Completion>> completions;
  uint64_t seed = 0;
  int prompt_len = 0;
  int open = 0;  // completions not finished
};

LoomEngine::LoomEngine(ModelRunner& runner, const EngineConfig& cfg, ModelRunner* draft)
    : runner_(runner),
      cfg_(cfg),
      cache_(kv_spec_with(runner.kv_spec(), cfg.kv_cache_dtype), cfg.block_size,
             cfg.num_blocks > 0
                 ? cfg.num_blocks
                 : KvCache::blocks_for_bytes(kv_spec_with(runner.kv_spec(), cfg.kv_cache_dtype),
                                             cfg.block_size, cfg.kv_cache_bytes),
             runner.cache_backend()),
      scheduler_(cfg.scheduler, cache_) {
  validate(cfg.speculative);
  LOOM_CHECK(cfg.speculative.method == SpeculativeMethod::None || runner.scores_many_rows(),
             "speculative decoding needs a model runner that scores every guess in one pass; "
             "this one (tensor-parallel serving) does not");
  LOOM_CHECK((cfg.speculative.method == SpeculativeMethod::Draft) == (draft != nullptr),
             draft ? "a draft model without --speculative draft"
                   : "speculative method draft without a draft model");
  if (draft) {
    LOOM_CHECK(draft->vocab() == runner.vocab(), "the draft model's vocabulary (", draft->vocab(),
               " tokens) differs from the target's (", runner.vocab(), ")");
    draft_ = std::make_unique<DraftModel>(*draft, cfg.block_size,
                                          cache_.num_blocks() + cfg.scheduler.max_num_seqs);
  }
  stats_.kv_blocks_total = cache_.num_blocks();
  stats_.kv_block_size = cache_.block_size();
  stats_.kv_cache_dtype = kv_stored_name(cache_.view().spec.dtype);
  logits_.resize(size_t(runner.vocab()));
}

LoomEngine::~LoomEngine() {
  stop(0);
}

int64_t LoomEngine::submit(std::vector<int32_t> prompt, const SamplingParams& params,
                           std::function<void(const TokenEvent&)> on_event) {
  if (!accepting_) throw RequestRejected{503, "the server is shutting down"};
  try {
    validate(params, runner_.vocab());
  } catch (const Error& e) {
    throw RequestRejected{400, e.what()};
  }
  if (prompt.empty()) throw RequestRejected{400, "the prompt is empty"};
  for (int32_t t : prompt)
    if (t < 0 || t >= runner_.vocab())
      throw RequestRejected{
          400, cat("token id ", t, " outside the vocabulary [0, ", runner_.vocab(), ")")};
  const int64_t total = int64_t(prompt.size()) + params.max_tokens;
  if (total > runner_.max_seq())
    throw RequestRejected{400, cat("this model's maximum context length is ", runner_.max_seq(),
                                   " tokens; the prompt has ", prompt.size(),
                                   " and max_tokens asks for ", params.max_tokens)};
  const int64_t blocks = (total + cfg_.block_size - 1) / cfg_.block_size;
  if (blocks > cache_.num_blocks())
    throw RequestRejected{400, cat("the request needs ", blocks, " KV-cache blocks; the pool has ",
                                   cache_.num_blocks())};
  if (in_flight_.load() >= cfg_.max_queue)
    throw RequestRejected{429, cat("the queue is full (", cfg_.max_queue, " requests)")};
  auto r = std::make_unique<Request>();
  r->id = next_id_++;
  r->params = params;
  r->on_event = std::move(on_event);
  r->prompt_len = static_cast<int>(prompt.size());
  r->seed = params.seed ? *params.seed : cfg_.seed * 0x9e3779b97f4a7c15ull + uint64_t(r->id);
  for (int i = 0; i < params.n; ++i) {
    auto c = std::make_unique<Completion>();
    c->request = r.get();
    c->index = i;
    c->seq.id = r->id * 1024 + i;
    c->seq.tokens = prompt;
    c->seq.prompt_len = r->prompt_len;
    c->seq.owner = c.get();
    if (params.constraint) c->constraint_state = params.constraint->start();
    r->completions.push_back(std::move(c));
  }
  r->open = params.n;
  const int64_t id = r->id;
  ++in_flight_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(r));
    ++stats_.requests_total;
  }
  wake_.notify_one();
  return id;
}

void LoomEngine::submit_embeddings(std::vector<std::vector<int32_t>> inputs,
                                   const EmbeddingOptions& opt,
                                   std::function<void(const EmbeddingResult&)> done) {
  if (!accepting_) throw RequestRejected{503, "the server is shutting down"};
  if (!runner_.embeds())
    throw RequestRejected{400,
                          "this model runner (tensor-parallel serving) computes no embeddings"};
  try {
    check_embedding_inputs(inputs, runner_.vocab(), runner_.max_seq());
  } catch (const Error& e) {
    throw RequestRejected{400, e.what()};
  }
  if (in_flight_.load() >= cfg_.max_queue)
    throw RequestRejected{429, cat("the queue is full (", cfg_.max_queue, " requests)")};
  ++in_flight_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    embed_inbox_.push_back({std::move(inputs), opt, std::move(done)});
    ++stats_.requests_total;
  }
  wake_.notify_one();
}

bool LoomEngine::run_embeddings() {
  std::vector<EmbeddingJob> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs.swap(embed_inbox_);
  }
  for (EmbeddingJob& job : jobs) {
    EmbeddingResult res;
    for (const auto& in : job.inputs) res.prompt_tokens += static_cast<int>(in.size());
    try {
      res.vectors = runner_.embed(job.inputs, job.opt);
    } catch (const std::exception& e) {
      res.error = e.what();
    }
    if (res.error.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prompt_tokens_total += res.prompt_tokens;
    }
    --in_flight_;
    job.done(res);
  }
  return !jobs.empty();
}

void LoomEngine::cancel(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  wake_.notify_one();
}

EngineStats LoomEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void LoomEngine::take_inbox() {
  std::vector<std::unique_ptr<Request>> in;
  std::vector<int64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& r : in) {
    for (auto& c : r->completions) {
      if (r->params.max_tokens == 0) continue;  // finished below, never scheduled
      scheduler_.add(&c->seq);
    }
    Request* raw = r.get();
    requests_[r->id] = std::move(r);
    if (raw->params.max_tokens == 0)
      for (auto& c : raw->completions) finish(*c, "length");
  }
  for (int64_t id : cancels) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    for (auto& c : it->second->completions)
      if (!c->done) {
        scheduler_.remove(&c->seq);
        finish(*c, "abort");
      }
  }
}

bool LoomEngine::is_stop_token(const Completion& c, int32_t t) const {
  const SamplingParams& p = c.request->params;
  if (!p.ignore_eos)
    for (int32_t e : cfg_.eos_ids)
      if (t == e) return true;
  for (int32_t s : p.stop_token_ids)
    if (t == s) return true;
  return false;
}

void LoomEngine::emit(Completion& c, const std::vector<int32_t>& new_tokens,
                      const std::vector<float>& logprobs,
                      const std::vector<std::vector<std::pair<int32_t, float>>>& top, bool finished,
                      const std::string& reason) {
  Request& r = *c.request;
  TokenEvent ev;
  ev.request_id = r.id;
  ev.index = c.index;
  ev.tokens = new_tokens;
  ev.logprobs = logprobs;
  ev.top_logprobs = top;
  // Text: everything decoded so far, minus what could still become a stop string or is an
  // incomplete character; all of it at the end.
  size_t ready = c.text.size();
  if (!finished) {
    size_t hold = utf8_incomplete_tail(c.text);
    for (const std::string& s : r.params.stop)
      for (size_t k = std::min(s.size() - 1, c.text.size()); k > hold; --k)
        if (c.text.compare(c.text.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
    ready = c.text.size() - hold;
  }
  if (ready > c.sent) {
    ev.text = c.text.substr(c.sent, ready - c.sent);
    c.sent = ready;
  }
  ev.finished = finished;
  ev.finish_reason = reason;
  if (finished) {
    ev.usage.prompt_tokens = r.prompt_len;
    ev.usage.completion_tokens = c.generated;
    ev.usage.cached_prompt_tokens = c.seq.cached_prompt_tokens;
    ev.usage.accepted_draft_tokens = c.accepted;
    ev.usage.rejected_draft_tokens = c.rejected;
    ev.stop_token = c.stop_token;
  }
  if (r.on_event) r.on_event(ev);
}

void LoomEngine::finish(Completion& c, const std::string& reason) {
  if (c.done) return;
  c.done = true;
  if (draft_) draft_->forget(c.seq.id);
  emit(c, {}, {}, {}, true, reason);
  Request& r = *c.request;
  if (--r.open == 0) {
    --in_flight_;
    requests_.erase(r.id);  // destroys c
  }
}

// Guesses for every sequence that decodes next step (its last token is the only one left to
// compute); at most what max_tokens and the context still leave after the token that follows.
void LoomEngine::propose_drafts() {
  const SpeculativeConfig& sc = cfg_.speculative;
  std::vector<DraftModel::Job> jobs;
  std::vector<Sequence*> for_job;
  for (auto& [id, r] : requests_)
    for (auto& c : r->completions) {
      Sequence& q = c->seq;
      q.draft.clear();
      if (c->done || q.computed == 0 || q.computed + 1 != static_cast<int>(q.tokens.size()))
        continue;
      const int k = std::min({sc.num_speculative_tokens, r->params.max_tokens - c->generated - 1,
                              runner_.max_seq() - static_cast<int>(q.tokens.size())});
      if (k <= 0) continue;
      if (!draft_) {
        q.draft = ngram_propose(q.tokens, sc.prompt_lookup_min, sc.prompt_lookup_max, k);
        continue;
      }
      DraftModel::Job j;
      j.seq = q.id;
      j.tokens = &q.tokens;
      j.k = k;
      jobs.push_back(std::move(j));
      for_job.push_back(&q);
    }
  if (jobs.empty()) return;
  draft_->propose(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) for_job[i]->draft = std::move(jobs[i].guesses);
}

bool LoomEngine::step() {
  ProfileScope profile(DecodeProfile::kStep);
  const bool embedded = run_embeddings();
  take_inbox();
  if (cfg_.speculative.method != SpeculativeMethod::None) propose_drafts();
  std::vector<ScheduledChunk> chunks = scheduler_.schedule();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.requests_running = scheduler_.num_running();
    stats_.requests_waiting = scheduler_.num_waiting();
    stats_.kv_blocks_used = cache_.num_used();
    stats_.preemptions_total = scheduler_.preemptions();
    stats_.cached_tokens_total = scheduler_.cached_tokens();
  }
  if (chunks.empty()) {
    profile.discard();  // idle polls are not steps
    return embedded;
  }
  std::vector<SeqChunk> batch;
  int want = 0;
  // A verification chunk's tokens: the sequence's last token, then its guesses.
  std::vector<std::vector<int32_t>> verify(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ScheduledChunk& s = chunks[i];
    SeqChunk c;
    c.tokens = s.seq->tokens.data() + s.start;
    if (s.draft > 0) {
      verify[i].assign(1, s.seq->tokens[size_t(s.start)]);
      verify[i].insert(verify[i].end(), s.seq->draft.begin(), s.seq->draft.begin() + s.draft);
      c.tokens = verify[i].data();
    }
    c.n = s.n;
    c.start_pos = s.start;
    c.block_table = s.seq->blocks.data();
    c.num_blocks = static_cast<int>(s.seq->blocks.size());
    c.want_logits = s.want_logits;
    c.logits_rows = s.want_logits ? 1 + s.draft : 1;
    want += s.want_logits ? 1 + s.draft : 0;
    batch.push_back(c);
  }
  const int V = runner_.vocab();
  logits_.resize(size_t(want) * V);
  runner_.forward(batch, cache_.view(), logits_.data());
  scheduler_.after_step(chunks);
  int64_t prompt_tokens = 0, generated = 0;
  int64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted = 0;
  int row = 0;
  std::vector<Completion*> finished;
  std::vector<std::string> reasons;
  for (const ScheduledChunk& s : chunks) {
    Completion* c = static_cast<Completion*>(s.seq->owner);
    if (s.start < c->seq.prompt_len) prompt_tokens += std::min(s.n, c->seq.prompt_len - s.start);
    if (!s.want_logits) continue;
    Request& r = *c->request;
    const constrain::TokenConstraint* con = r.params.constraint.get();
    // Row j scores the token after the sequence's last token and guesses 0 .. j-1: each row is
    // sampled exactly as plain decoding samples it, and guess j is kept when the draw is it.
    const int first_row = row;
    row += 1 + s.draft;
    int matched = 0;
    std::string reason;
    bool ended = false;
    for (int j = 0; j <= s.draft && !ended; ++j) {
      float* x = logits_.data() + int64_t(first_row + j) * V;
      SampledToken t;
      {
        ProfileScope sampling(DecodeProfile::kSample);
        const uint64_t* allowed = nullptr;
        if (con) {
          const bool complete = con->accepting(c->constraint_state);
          if (!con->can_continue(c->constraint_state)) {
            // Nothing may follow from the start (a choice of the empty string).
            reason = complete ? "stop" : "length";
            break;
          }
          const std::vector<uint64_t>& bits = con->allowed(c->constraint_state);
          mask_.assign((size_t(V) + 63) / 64, 0);
          std::copy(bits.begin(), bits.begin() + std::min(bits.size(), mask_.size()),
                    mask_.begin());
          if (complete)  // end of text only where the text is complete
            for (int32_t e : cfg_.eos_ids)
              if (e >= 0 && e < V) mask_[size_t(e) / 64] |= uint64_t(1) << (e % 64);
          allowed = mask_.data();
        }
        t = sample(x, V, r.params, c->seq.tokens, c->seq.prompt_len, r.seed, uint64_t(c->index),
                   uint64_t(c->generated), allowed);
      }
      ++generated;
      ++c->generated;
      std::vector<int32_t> shown;
      if (is_stop_token(*c, t.token)) {
        reason = "stop";
        c->stop_token = t.token;
      } else {
        shown.push_back(t.token);
        c->seq.tokens.push_back(t.token);
        if (con) {
          c->constraint_state = con->advance(c->constraint_state, t.token);
          LOOM_CHECK(c->constraint_state != constrain::ByteDfa::kDead, "token ", t.token,
                     " was drawn outside its structured-output mask");
        }
        if (cfg_.detokenize) {
          const std::vector<int32_t> out(c->seq.tokens.begin() + c->seq.prompt_len,
                                         c->seq.tokens.end());
          c->text = cfg_.detokenize(out);
          for (const std::string& st : r.params.stop) {
            const size_t at = c->text.find(st);
            if (at != std::string::npos) {
              c->text.resize(at);
              reason = "stop";
            }
          }
        }
        // A constrained text that nothing may follow is complete now (no step spent on its end).
        if (reason.empty() && con && !con->can_continue(c->constraint_state))
          reason = con->accepting(c->constraint_state) ? "stop" : "length";
        if (reason.empty() &&
            (c->generated >= r.params.max_tokens || int(c->seq.tokens.size()) >= runner_.max_seq()))
          reason = "length";
      }
      std::vector<float> lp;
      std::vector<std::vector<std::pair<int32_t, float>>> top;
      if (r.params.logprobs >= 0) {
        lp.push_back(t.logprob);
        top.push_back(t.top);
      }
      emit(*c, shown, lp, top, false, "");
      const bool kept = j < s.draft && t.token == s.seq->draft[size_t(j)];
      matched += kept;
      ended = !reason.empty() || !kept;
    }
    if (s.draft > 0) {
      c->accepted += matched;
      c->rejected += s.draft - matched;
      ++spec_drafts;
      spec_draft_tokens += s.draft;
      spec_accepted += matched;
      if (reason.empty()) scheduler_.accept_draft(&c->seq, matched);
    }
    if (!reason.empty()) {
      finished.push_back(c);
      reasons.push_back(reason);
    }
  }
  for (size_t i = 0; i < finished.size(); ++i) {
    scheduler_.remove(&finished[i]->seq);
    finish(*finished[i], reasons[i]);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.prompt_tokens_total += prompt_tokens;
  stats_.generation_tokens_total += generated;
  stats_.spec_drafts_total += spec_drafts;
  stats_.spec_draft_tokens_total += spec_draft_tokens;
  stats_.spec_accepted_tokens_total += spec_accepted;
  stats_.kv_blocks_used = cache_.num_used();
  // The finished sequences left: a caller that got its last answer reads counts without them
  // (they were refreshed only at the next step's start, which raced with such a reader).
  stats_.requests_running = scheduler_.num_running();
  stats_.requests_waiting = scheduler_.num_waiting();
  return true;
}

void LoomEngine::run_until_idle() {
  while (true) {
    if (step()) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (inbox_.empty() && cancels_.empty() && embed_inbox_.empty() && scheduler_.empty()) return;
  }
}

void LoomEngine::start() {
  LOOM_CHECK(!thread_.joinable(), "the engine is running already");
  // OpenMP's thread count is per thread: a new thread starts from the default (every core, or
  // OMP_NUM_THREADS), not from what the caller set (`loom bench serve --threads 1` ran its
  // load runs' steps over 2 threads). The engine's steps use the caller's.
  const int omp_threads = omp_get_max_threads();
  thread_ = std::thread([this, omp_threads] {
    omp_set_num_threads(omp_threads);
    while (!stopping_) {
      try {
        if (step()) continue;
      } catch (const std::exception& e) {
        // A failed step (the model, a callback) ends the requests in it, not the server.
        log_warn("engine step failed, cancelling every request: ", e.what());
        abort_all();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(50), [this] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || !embed_inbox_.empty();
      });
    }
  });
}

void LoomEngine::stop(double drain_seconds) {
  accepting_ = false;
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(drain_seconds);
  while (thread_.joinable() && in_flight_.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  abort_all();
}

// Every request still open ends with "abort" and frees its blocks.
void LoomEngine::abort_all() {
  take_inbox();
  std::vector<EmbeddingJob> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs.swap(embed_inbox_);
  }
  for (EmbeddingJob& job : jobs) {
    EmbeddingResult res;
    res.error = "the engine stopped before computing the embeddings";
    --in_flight_;
    job.done(res);
  }
  std::vector<int64_t> left;
  for (auto& [id, r] : requests_) left.push_back(id);
  for (int64_t id : left) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request* r = it->second.get();
    for (auto& c : r->completions)
      if (!c->done) {
        scheduler_.remove(&c->seq);
        finish(*c, "abort");
        if (requests_.find(id) == requests_.end()) break;
      }
  }
}

}  // namespace loom::infer
