#include "serve/server.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "serve/connection.h"
#include "serve/openai_api.h"
#include "serve/structured_output.h"
#include "serve/tool_calls.h"

namespace loom::serve {

// Counters and latency histograms for /metrics (Prometheus text format).
struct Server::Metrics {
  std::mutex mu;
  std::map<std::string, int64_t> requests;  // by final status: success, error, abort
  static constexpr double kBuckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  struct Histogram {
    std::vector<int64_t> counts = std::vector<int64_t>(std::size(kBuckets) + 1, 0);
    double sum = 0;
    int64_t n = 0;
    void add(double v) {
      size_t b = 0;
      while (b < std::size(kBuckets) && v > kBuckets[b]) ++b;
      ++counts[b];
      sum += v;
      ++n;
    }
  } ttft, tpot;
};

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void send_json(httplib::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, e.body());
}

// One API request's engine requests and what they produced, shared by the engine's callback
// (on the engine thread) and the HTTP handler (waiting, or streaming chunks).
struct Exchange {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ChoiceResult> choices;
  std::vector<int64_t> engine_ids;
  std::deque<std::string> chunks;  // streamed: serialised "data: ..." events not yet sent
  std::vector<bool> started;
  int open = 0;
  double t0 = 0, t_first = 0, t_last = 0;
  int64_t tokens = 0;
  std::vector<data::ToolDef> tool_defs;
  std::vector<ToolCallStream> tools;  // per choice, when the request offers tools
};

}  // namespace

Server::Server(infer::Engine& engine, const data::BpeTokenizer* tok, const data::ChatTemplate* chat,
               const ServerOptions& opt)
    : engine_(engine),
      tok_(tok),
      chat_(chat),
      opt_(opt),
      http_(std::make_unique<httplib::Server>()),
      metrics_(std::make_unique<Metrics>()) {
  // Enough workers that /health and /metrics answer while many requests wait on the engine.
  http_->new_task_queue = [] { return new httplib::ThreadPool(64); };
  http_->set_read_timeout(30, 0);
  http_->set_payload_max_length(opt_.max_body_bytes);
  http_->set_write_timeout(30, 0);
  // Debian's compiled cpp-httplib listens with a backlog of 5: a burst of clients would see
  // refused connections. The socket is captured here and listened on again with room for 1024.
  http_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char*>(&yes), sizeof(yes));
    socket_ = static_cast<int>(sock);
  });
  routes();
}

Server::~Server() {
  stop();
}

int Server::bind() {
  const int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host)
                                  : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  LOOM_CHECK(port > 0, "cannot listen on ", opt_.host, ":", opt_.port,
             " (in use, or not an address of this machine)");
  if (socket_ >= 0) ::listen(socket_, 1024);
  return port;
}

void Server::run() {
  http_->listen_after_bind();
}

void Server::stop() {
  if (http_) http_->stop();
}

std::vector<int32_t> Server::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  if (tok_)
    tok_->encode(text, ids, /*allow_special=*/false);
  else
    for (unsigned char c : text) ids.push_back(c);
  return ids;
}

// Ids past the tokenizer (a model vocabulary padded beyond it) decode to nothing.
std::string Server::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t t : ids) {
    if (tok_ && t >= 0 && t < tok_->vocab_size())
      tok_->decode_append(t, s);
    else if (!tok_ && t >= 0 && t < 256)
      s.push_back(static_cast<char>(t));
  }
  return s;
}

StructuredOutputs& Server::structured() {
  std::call_once(structured_once_,
                 [this] { structured_ = std::make_unique<StructuredOutputs>(tok_); });
  return *structured_;
}

void Server::routes() {
  httplib::Server& h = *http_;
  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    Json j = Json::object();
    j["status"] = ready_ ? "ok" : "loading";
    send_json(res, ready_ ? 200 : 503, j);
  });
  h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    Json m = Json::object();
    m["id"] = opt_.model_name;
    m["object"] = "model";
    m["created"] = int64_t(std::time(nullptr));
    m["owned_by"] = "loom";
    m["max_model_len"] = opt_.max_seq;
    Json j = Json::object();
    j["object"] = "list";
    Json data = Json::array();
    data.push_back(m);
    j["data"] = data;
    send_json(res, 200, j);
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const infer::EngineStats s = engine_.stats();
    std::string out;
    auto line = [&](const std::string& name, const std::string& type, const std::string& help,
                    double v) {
      out += cat("# HELP loom:", name, " ", help, "\n# TYPE loom:", name, " ", type,
                 "\nloom:", name, " ", v, "\n");
    };
    line("num_requests_running", "gauge", "Sequences in the running batch.", s.requests_running);
    line("num_requests_waiting", "gauge", "Sequences waiting to be scheduled.", s.requests_waiting);
    line("kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use.",
         s.kv_blocks_total ? double(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
    line("prompt_tokens_total", "counter", "Prompt tokens computed.", s.prompt_tokens_total);
    line("generation_tokens_total", "counter", "Tokens generated.", s.generation_tokens_total);
    line("prompt_tokens_cached_total", "counter",
         "Prompt tokens found in the prefix cache (not computed).", s.cached_tokens_total);
    line("num_preemptions_total", "counter", "Sequences preempted for KV-cache room.",
         s.preemptions_total);
    std::lock_guard<std::mutex> lock(metrics_->mu);
    out +=
        "# HELP loom:request_total Finished requests by outcome.\n"
        "# TYPE loom:request_total counter\n";
    for (auto& [k, v] : metrics_->requests)
      out += cat("loom:request_total{outcome=\"", k, "\"} ", v, "\n");
    auto hist = [&](const std::string& name, const std::string& help,
                    const Metrics::Histogram& hg) {
      out += cat("# HELP loom:", name, " ", help, "\n# TYPE loom:", name, " histogram\n");
      int64_t acc = 0;
      for (size_t b = 0; b < std::size(Metrics::kBuckets); ++b) {
        acc += hg.counts[b];
        out += cat("loom:", name, "_bucket{le=\"", Metrics::kBuckets[b], "\"} ", acc, "\n");
      }
      out += cat("loom:", name, "_bucket{le=\"+Inf\"} ", hg.n, "\nloom:", name, "_sum ", hg.sum,
                 "\nloom:", name, "_count ", hg.n, "\n");
    };
    hist("time_to_first_token_seconds", "Time to first token.", metrics_->ttft);
    hist("time_per_output_token_seconds", "Time per output token after the first.", metrics_->tpot);
    res.set_content(out, "text/plain; version=0.0.4");
  });
  h.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      Json j = Json::parse(req.body, "request body");
      std::vector<int32_t> ids;
      if (j.is_object() && j.contains("messages")) {
        if (!chat_)
          throw ApiError{400, "this server has no chat template", "invalid_request_error",
                         "messages"};
        std::vector<data::ChatMessage> ms;
        for (const Json& m : j.at("messages").as_array())
          ms.push_back({m.at("role").as_string(), m.at("content").as_string()});
        ids = chat_->prompt_ids(ms);
      } else if (j.is_object() && j.contains("prompt") && j.at("prompt").is_string()) {
        ids = encode(j.at("prompt").as_string());
      } else {
        throw ApiError{400, "expected {\"prompt\": string} or {\"messages\": [...]}",
                       "invalid_request_error", "prompt"};
      }
      Json out = Json::object(), a = Json::array();
      for (int32_t t : ids) a.push_back(int64_t(t));
      out["tokens"] = a;
      out["count"] = int64_t(ids.size());
      out["max_model_len"] = opt_.max_seq;
      send_json(res, 200, out);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError{400, e.what(), "invalid_request_error", ""});
    }
  });
  h.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      Json j = Json::parse(req.body, "request body");
      if (!j.is_object() || !j.contains("tokens") || !j.at("tokens").is_array())
        throw ApiError{400, "expected {\"tokens\": [ids]}", "invalid_request_error", "tokens"};
      std::vector<int32_t> ids;
      for (const Json& t : j.at("tokens").as_array()) {
        const int64_t v = t.type() == Json::Type::Int ? t.as_int() : -1;
        if (v < 0 || v >= (tok_ ? tok_->vocab_size() : 256))
          throw ApiError{400, cat("token id ", t.dump(), " outside the vocabulary"),
                         "invalid_request_error", "tokens"};
        ids.push_back(int32_t(v));
      }
      Json out = Json::object();
      out["prompt"] = decode(ids);
      send_json(res, 200, out);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError{400, e.what(), "invalid_request_error", ""});
    }
  });

  auto generate = [this](bool chat, const httplib::Request& req, httplib::Response& res) {
    ApiRequest r;
    std::vector<std::vector<int32_t>> prompts;
    // Generation requests hold an HTTP worker while they wait; past this many the server answers
    // 429 so that workers stay free for /health and /metrics.
    struct Slot {
      std::atomic<int>& n;
      ~Slot() { --n; }
    } slot{in_flight_};
    const int busy = ++in_flight_;
    try {
      if (!ready_) throw ApiError{503, "the model is loading", "server_error", ""};
      if (busy > kMaxInFlight)
        throw ApiError{429, cat("too many concurrent requests (", kMaxInFlight, ")"),
                       "rate_limit_error", ""};
      r = parse_request(req.body, chat, opt_.default_max_tokens);
      if (!r.model.empty() && r.model != opt_.model_name)
        throw ApiError{404, cat("The model `", r.model, "` does not exist."),
                       "invalid_request_error", "model", "model_not_found"};
      if (chat) {
        if (!chat_)
          throw ApiError{400, "this server has no chat template (start it with --chat-template)",
                         "invalid_request_error", "messages"};
        prompts.push_back(chat_->prompt_ids(data::tool_conversation(
            chat_->name(), r.messages,
            r.structured.uses_tools() ? r.structured.tools : std::vector<data::ToolDef>{})));
      } else {
        for (const auto& p : r.prompts) prompts.push_back(encode(p));
        for (const auto& p : r.prompt_ids) prompts.push_back(p);
      }
      if (r.structured.kind != StructuredRequest::Kind::None || !r.structured.tools.empty())
        r.sampling.constraint = structured().constraint(r.structured, chat_ ? chat_->name() : "");
      if (r.echo && r.stream)
        throw ApiError{400, "'echo' with 'stream' is not supported", "invalid_request_error",
                       "echo"};
    } catch (const ApiError& e) {
      send_error(res, e);
      return;
    }
    auto ex = std::make_shared<Exchange>();
    const int n = r.sampling.n;
    ex->choices.resize(prompts.size() * size_t(n));
    ex->started.assign(ex->choices.size(), false);
    ex->open = static_cast<int>(ex->choices.size());
    ex->t0 = now();
    auto ctx = std::make_shared<ResponseContext>();
    ctx->id = cat(chat ? "chatcmpl-" : "cmpl-", next_id_++);
    ctx->model = opt_.model_name;
    ctx->created = int64_t(std::time(nullptr));
    ctx->chat = chat;
    ctx->want_logprobs = r.sampling.logprobs >= 0;
    ctx->token_text = [this](int32_t t) { return decode({t}); };
    const bool stream = r.stream;
    if (r.structured.uses_tools()) {
      ex->tool_defs = r.structured.tools;
      for (size_t k = 0; k < ex->choices.size(); ++k)
        ex->tools.emplace_back(chat_->name(), &ex->tool_defs, r.structured.parallel_tool_calls,
                               r.structured.forces_call(), cat("call_", ctx->id, "_", k));
    }
    try {
      for (size_t p = 0; p < prompts.size(); ++p) {
        const int base = static_cast<int>(p) * n;
        const int64_t id = engine_.submit(
            prompts[p], r.sampling, [ex, ctx, base, stream](const infer::TokenEvent& ev) {
              std::lock_guard<std::mutex> lock(ex->mu);
              const int k = base + ev.index;
              ChoiceResult& c = ex->choices[size_t(k)];
              // With tools, the text that is a call leaves the content (tool_calls.h).
              std::string text = ev.text, reason = ev.finish_reason;
              if (!ex->tools.empty()) {
                text = ex->tools[size_t(k)].feed(ev.text);
                if (ev.finished) {
                  ParsedReply reply = ex->tools[size_t(k)].finish();
                  text += reply.content;
                  c.tool_calls = std::move(reply.calls);
                  if (!c.tool_calls.empty() && reason == "stop") reason = "tool_calls";
                }
              }
              c.text += text;
              c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
              c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
              c.top.insert(c.top.end(), ev.top_logprobs.begin(), ev.top_logprobs.end());
              if (!ev.tokens.empty()) {
                if (ex->t_first == 0) ex->t_first = now();
                ex->t_last = now();
                ex->tokens += int64_t(ev.tokens.size());
              }
              if (stream && (!text.empty() || ev.finished || !ev.tokens.empty())) {
                const bool first = !ex->started[size_t(k)];
                ex->started[size_t(k)] = true;
                if (!text.empty() || first || (ctx->want_logprobs && !ev.tokens.empty()))
                  ex->chunks.push_back(
                      "data: " + stream_chunk(*ctx, k, text, &ev, "", first).dump() + "\n\n");
                if (!c.tool_calls.empty())
                  ex->chunks.push_back("data: " + tool_calls_chunk(*ctx, k, c.tool_calls).dump() +
                                       "\n\n");
                if (ev.finished && reason != "abort")
                  ex->chunks.push_back(
                      "data: " + stream_chunk(*ctx, k, "", nullptr, reason, false).dump() + "\n\n");
              }
              if (ev.finished) {
                c.finish_reason = reason;
                c.usage = ev.usage;
                --ex->open;
              }
              ex->cv.notify_all();
            });
        std::lock_guard<std::mutex> lock(ex->mu);
        ex->engine_ids.push_back(id);
      }
    } catch (const infer::RequestRejected& e) {
      for (int64_t id : ex->engine_ids) engine_.cancel(id);
      send_error(res, ApiError{e.http_status, e.message,
                               e.http_status == 400 ? "invalid_request_error" : "server_error",
                               e.http_status == 400 ? "prompt" : ""});
      std::lock_guard<std::mutex> lock(metrics_->mu);
      ++metrics_->requests["error"];
      return;
    }
    auto record = [this, ex](const std::string& outcome) {
      std::lock_guard<std::mutex> lock(metrics_->mu);
      ++metrics_->requests[outcome];
      if (ex->t_first > 0) {
        metrics_->ttft.add(ex->t_first - ex->t0);
        if (ex->tokens > 1) metrics_->tpot.add((ex->t_last - ex->t_first) / double(ex->tokens - 1));
      }
    };
    const double deadline = now() + opt_.request_timeout_seconds;
    if (!stream) {
      // The client's socket, watched while the answer is generated: one that hangs up cancels
      // its sequences at once (their blocks freed) instead of running to max_tokens.
      const int fd = find_connection_socket(req.local_port, req.remote_addr, req.remote_port);
      bool gone = false;
      std::unique_lock<std::mutex> lock(ex->mu);
      while (ex->open > 0) {
        ex->cv.wait_for(lock, std::chrono::milliseconds(50));
        if (now() > deadline) break;
        if (fd >= 0 && ex->open > 0 && peer_closed(fd)) {
          gone = true;
          break;
        }
      }
      // The outcome is counted before the cancel: once the engine has freed the blocks, a
      // reader of /metrics must already see the abort (the test waits for the blocks, then
      // reads the count; the other order raced under load).
      if (gone) {
        const std::vector<int64_t> ids = ex->engine_ids;
        lock.unlock();
        record("abort");
        for (int64_t id : ids) engine_.cancel(id);
        res.status = 499;  // nobody reads it: the connection is closed (nginx's "client closed")
        return;
      }
      if (ex->open > 0) {
        const std::vector<int64_t> ids = ex->engine_ids;
        lock.unlock();
        record("abort");
        for (int64_t id : ids) engine_.cancel(id);
        send_error(res, ApiError{504, "the request timed out", "server_error", ""});
        return;
      }
      std::vector<ChoiceResult> choices = ex->choices;
      lock.unlock();
      if (r.echo)
        for (size_t k = 0; k < choices.size(); ++k)
          choices[k].text = decode(prompts[k / size_t(n)]) + choices[k].text;
      record("success");
      send_json(res, 200, completion_response(*ctx, choices));
      return;
    }
    // Streamed: the provider runs on this worker thread until every choice ended.
    const bool include_usage = r.include_usage;
    ++in_flight_;  // the stream holds its worker until the provider ends (released below)
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ex, ctx, include_usage, deadline, record](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lock(ex->mu);
          ex->cv.wait_for(lock, std::chrono::milliseconds(100),
                          [&] { return !ex->chunks.empty() || ex->open == 0; });
          while (!ex->chunks.empty()) {
            const std::string c = std::move(ex->chunks.front());
            ex->chunks.pop_front();
            if (!sink.write(c.data(), c.size())) return false;  // client gone: releaser cancels
          }
          if (ex->open == 0) {
            if (include_usage) {
              infer::Usage total;
              for (size_t k = 0; k < ex->choices.size(); ++k) {
                total.completion_tokens += ex->choices[k].usage.completion_tokens;
                if (k == 0 ||
                    ex->choices[k].usage.prompt_tokens != ex->choices[k - 1].usage.prompt_tokens) {
                  total.prompt_tokens += ex->choices[k].usage.prompt_tokens;
                  total.cached_prompt_tokens += ex->choices[k].usage.cached_prompt_tokens;
                }
              }
              const std::string u = "data: " + usage_chunk(*ctx, total).dump() + "\n\n";
              sink.write(u.data(), u.size());
            }
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            lock.unlock();
            record("success");
            sink.done();
            return true;
          }
          if (now() > deadline) return false;
          return sink.is_writable ? sink.is_writable() : true;
        },
        [this, ex](bool success) {
          --in_flight_;
          // On a closed connection (or an error): cancel whatever is still running.
          std::vector<int64_t> ids;
          {
            std::lock_guard<std::mutex> lock(ex->mu);
            if (success && ex->open == 0) return;
            ids = ex->engine_ids;
          }
          for (int64_t id : ids) engine_.cancel(id);
          std::lock_guard<std::mutex> lock(metrics_->mu);
          ++metrics_->requests["abort"];
        });
  };
  h.Post("/v1/completions",
         [generate](const httplib::Request& q, httplib::Response& s) { generate(false, q, s); });
  h.Post("/v1/chat/completions",
         [generate](const httplib::Request& q, httplib::Response& s) { generate(true, q, s); });
  h.set_error_handler(
      [max = opt_.max_body_bytes](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;  // an API error already written
        ApiError e{res.status, cat("no route for ", req.method, " ", req.path),
                   "invalid_request_error", ""};
        if (res.status == 404) e.message = cat("Not found: ", req.method, " ", req.path);
        if (res.status == 413)
          e.message = cat("request body larger than ", max, " bytes (loom serve --max-body-mb)");
        send_error(res, e);
      });
  h.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError{500, what, "server_error", ""});
      });
}

}  // namespace loom::serve
