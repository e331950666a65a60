#include "serve/server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <charconv>
#include <chrono>
#include <ctime>
#include <map>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "serve/embeddings_api.h"
#include "serve/openai_api.h"
#include "serve/structured_output.h"
#include "serve/tool_calls.h"

namespace loom::serve {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// Counters and latency histograms for /metrics (Prometheus text format).
struct Server::Metrics {
  std::map<std::string, int64_t> requests;  // by outcome: success, error, abort, rate_limited
  // Finished completions by finish reason (stop, length, abort, tool_calls; an embedding
  // request counts as stop), vLLM's request_success_total.
  std::map<std::string, int64_t> finished;
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
  } ttft, tpot, e2e, itl;  // itl: every gap between a choice's token events
};

// One API request's engine requests and what they produced, on the I/O thread.
struct Server::Exchange {
  std::shared_ptr<HttpConnection> conn;  // reset once answered
  ResponseContext ctx;
  bool stream = false, echo = false, include_usage = false;
  bool done = false;  // answered (or its client gone): later engine events are dropped
  int n = 1;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<ChoiceResult> choices;
  std::vector<bool> started;
  std::vector<double> last_token_at;  // per choice, 0 before its first token
  std::vector<int64_t> engine_ids;
  int open = 0;
  double t0 = 0, t_first = 0, t_last = 0;
  int64_t tokens = 0;
  std::unique_ptr<net::steady_timer> deadline;
  std::vector<data::ToolDef> tool_defs;
  std::vector<ToolCallStream> tools;  // per choice, when the request offers tools
};

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Prometheus sample values, exact: integers as integers, others in the shortest form that
// reads back as the same double.
std::string number_text(int64_t v) {
  return std::to_string(v);
}
std::string number_text(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(const std::string& v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

void send_json(HttpConnection& c, int status, const Json& j,
               const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  c.respond(status, "application/json", j.dump(), headers);
}

void send_error(HttpConnection& c, const ApiError& e,
                const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  send_json(c, e.status, e.body(), headers);
}

std::string sse(const Json& j) {
  return "data: " + j.dump() + "\n\n";
}

}  // namespace

Server::Server(infer::Engine& engine, const data::BpeTokenizer* tok, const data::ChatTemplate* chat,
               const ServerOptions& opt)
    : engine_(engine),
      tok_(tok),
      chat_(chat),
      opt_(opt),
      io_(std::make_shared<net::io_context>(1)),
      metrics_(std::make_unique<Metrics>()),
      compile_(std::make_unique<net::thread_pool>(1)) {
  limits_.read_timeout = opt_.read_timeout_seconds;
  limits_.write_timeout = opt_.write_timeout_seconds;
  limits_.max_body_bytes = opt_.max_body_bytes;
  handler_ = [this](const std::shared_ptr<HttpConnection>& c, const HttpRequest& req) {
    try {
      handle(c, req);
    } catch (const std::exception& e) {
      send_error(*c, ApiError{500, e.what(), "server_error"});
    }
  };
}

Server::~Server() {
  stop();
  compile_->join();  // its jobs post onto io_, which no longer runs them
}

int Server::bind() {
  boost::system::error_code ec;
  const auto addr = net::ip::make_address(opt_.host, ec);
  LOOM_CHECK(!ec, "--host ", opt_.host, " is not a numeric IP address");
  acceptor_ = std::make_unique<tcp::acceptor>(*io_);
  const tcp::endpoint ep(addr, static_cast<unsigned short>(opt_.port));
  acceptor_->open(ep.protocol(), ec);
  if (!ec) acceptor_->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(ep, ec);
  // Room for a burst of thousands of clients connecting at once (the kernel caps it at
  // net.core.somaxconn).
  if (!ec) acceptor_->listen(4096, ec);
  LOOM_CHECK(!ec, "cannot listen on ", opt_.host, ":", opt_.port, " (", ec.message(), ")");
  accept();
  return acceptor_->local_endpoint().port();
}

void Server::accept() {
  acceptor_->async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_->is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE) and the like: wait a little rather than spin.
      log_warn("loom serve: accept failed: ", ec.message());
      auto t = std::make_shared<net::steady_timer>(*io_, std::chrono::milliseconds(100));
      t->async_wait([this, t](boost::system::error_code) { accept(); });
      return;
    }
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // a streamed token goes out at once
    std::make_shared<HttpConnection>(std::move(socket), limits_, handler_)->start();
    accept();
  });
}

void Server::run() {
  io_->run();
}

void Server::stop(double grace_seconds) {
  if (grace_seconds > 0 && !io_->stopped()) {
    net::post(*io_, [this] {
      boost::system::error_code ignored;
      if (acceptor_) acceptor_->close(ignored);
    });
    const double until = now() + grace_seconds;
    while (in_flight_.load() > 0 && now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    // The last answers' writes were started on the I/O thread; a round trip through it lets
    // their handlers run.
    auto flushed = std::make_shared<std::atomic<bool>>(false);
    net::post(*io_, [flushed] { *flushed = true; });
    while (!*flushed && !io_->stopped() && now() < until + 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  io_->stop();
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

std::string Server::metrics_text() const {
  const infer::EngineStats s = engine_.stats();
  std::string out;
  auto line = [&](const std::string& name, const std::string& type, const std::string& help,
                  const std::string& v) {
    out += cat("# HELP loom:", name, " ", help, "\n# TYPE loom:", name, " ", type, "\nloom:", name,
               " ", v, "\n");
  };
  line("num_requests_running", "gauge", "Sequences in the running batch.",
       number_text(s.requests_running));
  line("num_requests_waiting", "gauge", "Sequences waiting to be scheduled.",
       number_text(s.requests_waiting));
  line("http_requests_in_flight", "gauge", "Generation requests being answered over HTTP.",
       number_text(in_flight_.load()));
  line("kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use.",
       number_text(s.kv_blocks_total ? double(s.kv_blocks_used) / s.kv_blocks_total : 0.0));
  // vLLM's cache_config_info: the pool's configuration as labels of a constant 1.
  out += cat("# HELP loom:cache_config_info Information of the KV cache's configuration.\n",
             "# TYPE loom:cache_config_info gauge\nloom:cache_config_info{block_size=\"",
             s.kv_block_size, "\",cache_dtype=\"", s.kv_cache_dtype, "\",num_blocks=\"",
             s.kv_blocks_total, "\"} 1\n");
  line("prompt_tokens_total", "counter", "Prompt tokens computed.",
       number_text(s.prompt_tokens_total));
  line("generation_tokens_total", "counter", "Tokens generated.",
       number_text(s.generation_tokens_total));
  line("prompt_tokens_cached_total", "counter",
       "Prompt tokens found in the prefix cache (not computed).",
       number_text(s.cached_tokens_total));
  line("num_preemptions_total", "counter", "Sequences preempted for KV-cache room.",
       number_text(s.preemptions_total));
  // Speculative decoding, under vLLM's names (zero when it is off).
  line("spec_decode_num_drafts_total", "counter", "Verification passes that scored guesses.",
       number_text(s.spec_drafts_total));
  line("spec_decode_num_draft_tokens_total", "counter", "Speculative guesses scored.",
       number_text(s.spec_draft_tokens_total));
  line("spec_decode_num_accepted_tokens_total", "counter", "Speculative guesses kept.",
       number_text(s.spec_accepted_tokens_total));
  line("spec_decode_draft_acceptance_rate", "gauge", "Guesses kept over guesses scored.",
       number_text(s.spec_draft_tokens_total
                       ? double(s.spec_accepted_tokens_total) / s.spec_draft_tokens_total
                       : 0.0));
  out +=
      "# HELP loom:request_total Finished requests by outcome.\n"
      "# TYPE loom:request_total counter\n";
  for (auto& [k, v] : metrics_->requests)
    out += cat("loom:request_total{outcome=\"", k, "\"} ", number_text(v), "\n");
  // `labels`: "" or `key="value",` pairs, each followed by a comma.
  auto hist = [&](const std::string& name, const std::string& help, const Metrics::Histogram& hg,
                  const std::string& labels) {
    out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
    int64_t acc = 0;
    for (size_t b = 0; b < std::size(Metrics::kBuckets); ++b) {
      acc += hg.counts[b];
      out += cat(name, "_bucket{", labels, "le=\"", number_text(Metrics::kBuckets[b]), "\"} ",
                 number_text(acc), "\n");
    }
    const std::string braces =
        labels.empty() ? std::string() : "{" + labels.substr(0, labels.size() - 1) + "}";
    out += cat(name, "_bucket{", labels, "le=\"+Inf\"} ", number_text(hg.n), "\n", name, "_sum",
               braces, " ", number_text(hg.sum), "\n", name, "_count", braces, " ",
               number_text(hg.n), "\n");
  };
  hist("loom:time_to_first_token_seconds", "Time to first token.", metrics_->ttft, "");
  hist("loom:time_per_output_token_seconds", "Time per output token after the first.",
       metrics_->tpot, "");
  // The same figures under vLLM's names and model_name label, for dashboards built on them.
  const std::string model = cat("model_name=\"", label_value(opt_.model_name), "\"");
  auto vllm = [&](const std::string& name, const std::string& type, const std::string& help,
                  const std::string& v) {
    out += cat("# HELP vllm:", name, " ", help, "\n# TYPE vllm:", name, " ", type, "\nvllm:", name,
               "{", model, "} ", v, "\n");
  };
  vllm("num_requests_running", "gauge", "Number of requests in model execution batches.",
       number_text(s.requests_running));
  vllm("num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
       number_text(s.requests_waiting));
  vllm("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
       number_text(s.kv_blocks_total ? double(s.kv_blocks_used) / s.kv_blocks_total : 0.0));
  vllm("prompt_tokens_total", "counter", "Number of prefill tokens processed.",
       number_text(s.prompt_tokens_total));
  vllm("generation_tokens_total", "counter", "Number of generation tokens processed.",
       number_text(s.generation_tokens_total));
  vllm("num_preemptions_total", "counter", "Cumulative number of preemptions.",
       number_text(s.preemptions_total));
  vllm("prefix_cache_hits_total", "counter", "Prefix cache hits, in number of tokens.",
       number_text(s.cached_tokens_total));
  vllm("spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
       number_text(s.spec_drafts_total));
  vllm("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
       number_text(s.spec_draft_tokens_total));
  vllm("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
       number_text(s.spec_accepted_tokens_total));
  out +=
      "# HELP vllm:request_success_total Count of successfully processed requests.\n"
      "# TYPE vllm:request_success_total counter\n";
  for (const char* reason : {"stop", "length", "abort", "tool_calls"}) {
    const auto it = metrics_->finished.find(reason);
    out += cat("vllm:request_success_total{", model, ",finished_reason=\"", reason, "\"} ",
               number_text(it == metrics_->finished.end() ? int64_t(0) : it->second), "\n");
  }
  const std::string labels = model + ",";
  hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
       metrics_->ttft, labels);
  hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
       metrics_->itl, labels);
  hist("vllm:time_per_output_token_seconds",
       "Histogram of time per output token in seconds (per request, after the first).",
       metrics_->tpot, labels);
  hist("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
       metrics_->e2e, labels);
  return out;
}

void Server::check_model(const std::string& model) const {
  if (model.empty() || model == opt_.model_name) return;
  for (const std::string& a : opt_.model_aliases)
    if (model == a) return;
  throw ApiError{404, cat("The model `", model, "` does not exist."), "invalid_request_error",
                 "model", "model_not_found"};
}

void Server::handle(const std::shared_ptr<HttpConnection>& c, const HttpRequest& req) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const bool get = req.method() == boost::beast::http::verb::get;
  const bool post = req.method() == boost::beast::http::verb::post;
  // Bodies are read as JSON whatever their Content-Type says, as OpenAI's server does (curl -d
  // sends application/x-www-form-urlencoded).
  if (get && path == "/health") {
    Json j = Json::object();
    j["status"] = draining_ ? "draining" : ready_ ? "ok" : "loading";
    return send_json(*c, ready_ && !draining_ ? 200 : 503, j);
  }
  if (get && path == "/v1/models") {
    Json data = Json::array();
    std::vector<std::string> names = {opt_.model_name};
    names.insert(names.end(), opt_.model_aliases.begin(), opt_.model_aliases.end());
    for (const std::string& name : names) {
      Json m = Json::object();
      m["id"] = name;
      m["object"] = "model";
      m["created"] = int64_t(std::time(nullptr));
      m["owned_by"] = "loom";
      m["max_model_len"] = opt_.max_seq;
      data.push_back(m);
    }
    Json j = Json::object();
    j["object"] = "list";
    j["data"] = data;
    return send_json(*c, 200, j);
  }
  if (get && path == "/metrics")
    return c->respond(200, "text/plain; version=0.0.4", metrics_text());
  if (post && path == "/tokenize") {
    try {
      Json j = Json::parse(req.body(), "request body");
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
      return send_json(*c, 200, out);
    } catch (const ApiError& e) {
      return send_error(*c, e);
    } catch (const Error& e) {
      return send_error(*c, ApiError{400, e.what(), "invalid_request_error", ""});
    }
  }
  if (post && path == "/detokenize") {
    try {
      Json j = Json::parse(req.body(), "request body");
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
      out["prompt"] = decode(ids);  // bytes that end inside a character are written as U+FFFD
      return send_json(*c, 200, out);
    } catch (const ApiError& e) {
      return send_error(*c, e);
    } catch (const Error& e) {
      return send_error(*c, ApiError{400, e.what(), "invalid_request_error", ""});
    }
  }
  if (post && path == "/v1/embeddings") return embeddings(c, req);
  if (post && (path == "/v1/completions" || path == "/v1/chat/completions"))
    return generate(path == "/v1/chat/completions", c, req);
  send_error(*c, ApiError{404, cat("Not found: ", req.method_string(), " ", path),
                          "invalid_request_error", ""});
}

void Server::generate(bool chat, const std::shared_ptr<HttpConnection>& c, const HttpRequest& req) {
  ApiRequest r;
  std::vector<std::vector<int32_t>> prompts;
  try {
    if (draining_) throw ApiError{503, "the server is shutting down", "server_error", ""};
    if (!ready_) throw ApiError{503, "the model is loading", "server_error", ""};
    r = parse_request(req.body(), chat, opt_.default_max_tokens);
    check_model(r.model);
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
    if (r.echo && r.stream)
      throw ApiError{400, "'echo' with 'stream' is not supported", "invalid_request_error", "echo"};
  } catch (const ApiError& e) {
    return send_error(*c, e);
  }
  if (r.structured.kind == StructuredRequest::Kind::None && r.structured.tools.empty())
    return submit(chat, c, std::move(r), std::move(prompts));
  net::post(*compile_, [this, chat, c, r = std::move(r), prompts = std::move(prompts)]() mutable {
    std::optional<ApiError> err;
    try {
      r.sampling.constraint = structured().constraint(r.structured, chat_ ? chat_->name() : "");
    } catch (const ApiError& e) {
      err = e;
    } catch (const std::exception& e) {
      err = ApiError{500, e.what(), "server_error", ""};
    }
    net::post(*io_, [this, chat, c = std::move(c), r = std::move(r), prompts = std::move(prompts),
                     err = std::move(err)]() mutable {
      if (c->closed()) return;  // its client left while the constraint compiled
      if (err) return send_error(*c, *err);
      if (draining_)
        return send_error(*c, ApiError{503, "the server is shutting down", "server_error", ""});
      submit(chat, c, std::move(r), std::move(prompts));
    });
  });
}

void Server::embeddings(const std::shared_ptr<HttpConnection>& c, const HttpRequest& req) {
  EmbeddingsRequest r;
  std::vector<std::vector<int32_t>> inputs;
  try {
    if (draining_) throw ApiError{503, "the server is shutting down", "server_error", ""};
    if (!ready_) throw ApiError{503, "the model is loading", "server_error", ""};
    r = parse_embeddings_request(req.body());
    check_model(r.model);
    // Truncated vectors (OpenAI's v3 models) would be a different embedding: only the
    // model's own width is served.
    if (r.dimensions != 0 && r.dimensions != opt_.embedding_dimensions)
      throw ApiError{400,
                     cat("'dimensions' must equal this model's width, ", opt_.embedding_dimensions,
                         " (vectors are not truncated), got ", r.dimensions),
                     "invalid_request_error", "dimensions"};
    for (const std::string& t : r.texts) inputs.push_back(encode(t));
    for (auto& ids : r.ids) inputs.push_back(std::move(ids));
    for (size_t i = 0; i < inputs.size(); ++i)
      if (opt_.max_seq > 0 && int64_t(inputs[i].size()) > opt_.max_seq)
        throw ApiError{
            400,
            cat("'input' ", i, " has ", inputs[i].size(),
                " tokens; this model's maximum context length is ", opt_.max_seq, " tokens"),
            "invalid_request_error", "input"};
  } catch (const ApiError& e) {
    return send_error(*c, e);
  }
  const double t0 = now();
  ++in_flight_;
  try {
    engine_.submit_embeddings(
        std::move(inputs), opt_.embedding,
        [this, io = io_, c, model = opt_.model_name, base64 = r.base64,
         t0](const infer::EmbeddingResult& res) {
          // The vectors are written out on the I/O thread, as every answer is.
          net::post(*io, [this, c, model, base64, t0, res] {
            --in_flight_;
            if (!res.error.empty()) {
              ++metrics_->requests["error"];
              if (!c->closed()) send_error(*c, ApiError{503, res.error, "server_error", ""});
              return;
            }
            ++metrics_->requests["success"];
            ++metrics_->finished["stop"];
            metrics_->e2e.add(now() - t0);
            if (!c->closed())
              send_json(*c, 200,
                        embeddings_response(model, res.vectors, base64, res.prompt_tokens));
          });
        });
  } catch (const infer::RequestRejected& e) {
    --in_flight_;
    return send_rejection(*c, e, "input");
  }
}

void Server::send_rejection(HttpConnection& c, const infer::RequestRejected& e,
                            const std::string& param) {
  if (e.http_status == 429) {
    ++metrics_->requests["rate_limited"];
    return send_error(c, ApiError{429, e.message, "rate_limit_error", ""},
                      {{"Retry-After", std::to_string(opt_.retry_after_seconds)}});
  }
  ++metrics_->requests["error"];
  send_error(c, ApiError{e.http_status, e.message,
                         e.http_status == 400 ? "invalid_request_error" : "server_error",
                         e.http_status == 400 ? param : ""});
}

void Server::submit(bool chat, const std::shared_ptr<HttpConnection>& c, ApiRequest r,
                    std::vector<std::vector<int32_t>> prompts) {
  auto ex = std::make_shared<Exchange>();
  ex->conn = c;
  ex->n = r.sampling.n;
  ex->stream = r.stream;
  ex->echo = r.echo;
  ex->include_usage = r.include_usage;
  ex->prompts = prompts;
  ex->choices.resize(prompts.size() * size_t(ex->n));
  ex->started.assign(ex->choices.size(), false);
  ex->last_token_at.assign(ex->choices.size(), 0.0);
  ex->open = static_cast<int>(ex->choices.size());
  ex->t0 = now();
  ResponseContext& ctx = ex->ctx;
  ctx.id = cat(chat ? "chatcmpl-" : "cmpl-", next_id_++);
  ctx.model = opt_.model_name;
  ctx.created = int64_t(std::time(nullptr));
  ctx.chat = chat;
  ctx.n = ex->n;
  ctx.want_logprobs = r.sampling.logprobs >= 0;
  ctx.token_text = [this](int32_t t) { return decode({t}); };
  if (r.structured.uses_tools()) {
    ex->tool_defs = r.structured.tools;
    for (size_t k = 0; k < ex->choices.size(); ++k)
      ex->tools.emplace_back(chat_->name(), &ex->tool_defs, r.structured.parallel_tool_calls,
                             r.structured.forces_call(), cat("call_", ctx.id, "_", k));
  }
  try {
    for (size_t p = 0; p < prompts.size(); ++p) {
      infer::SamplingParams sp = r.sampling;
      // No max_tokens: what the context leaves after this prompt (at least 1, so that a prompt
      // filling the context is refused naming its length), capped by the server's default.
      if (!r.max_tokens_given) {
        const int left = opt_.max_seq > 0 ? opt_.max_seq - int(prompts[p].size()) : 256;
        sp.max_tokens = std::max(
            1, opt_.default_max_tokens > 0 ? std::min(left, opt_.default_max_tokens) : left);
      }
      const int base = static_cast<int>(p) * ex->n;
      const int64_t id =
          engine_.submit(prompts[p], sp, [this, io = io_, ex, base](const infer::TokenEvent& ev) {
            infer::TokenEvent e = ev;
            e.index += base;
            net::post(*io, [this, ex, e] { on_event(ex, e); });
          });
      ex->engine_ids.push_back(id);
    }
  } catch (const infer::RequestRejected& e) {
    for (int64_t id : ex->engine_ids) engine_.cancel(id);
    ex->done = true;
    return send_rejection(*c, e, "prompt");
  }
  ++in_flight_;
  std::weak_ptr<Exchange> weak = ex;
  c->on_gone = [this, weak] {
    if (auto x = weak.lock()) give_up(x, "abort");
  };
  ex->deadline = std::make_unique<net::steady_timer>(
      *io_, std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                std::chrono::duration<double>(opt_.request_timeout_seconds)));
  ex->deadline->async_wait([this, weak](boost::system::error_code ec) {
    auto x = weak.lock();
    if (ec || !x || x->done) return;
    const ApiError e{504, "the request timed out", "server_error", ""};
    if (x->stream) {
      x->conn->stream(sse(e.body()));
      x->conn->stream("data: [DONE]\n\n");
      x->conn->end_stream();
    } else {
      send_error(*x->conn, e);
    }
    give_up(x, "abort");
  });
  if (ex->stream) c->begin_stream("text/event-stream");
}

// The exchange ends unanswered (its client left, or it timed out): its sequences are cancelled
// at once, freeing their blocks. The outcome is counted first: a reader of /metrics who sees
// the blocks freed must already see it.
void Server::give_up(const std::shared_ptr<Exchange>& ex, const std::string& outcome) {
  if (ex->done) return;
  ex->done = true;
  ++metrics_->requests[outcome];
  for (const ChoiceResult& c : ex->choices)
    ++metrics_->finished[c.finish_reason.empty() ? "abort" : c.finish_reason];
  --in_flight_;
  if (ex->deadline) ex->deadline->cancel();
  for (int64_t id : ex->engine_ids) engine_.cancel(id);
  if (ex->conn) ex->conn->on_gone = nullptr;
  ex->conn.reset();
}

void Server::on_event(const std::shared_ptr<Exchange>& ex, const infer::TokenEvent& ev) {
  if (ex->done) return;
  const size_t k = size_t(ev.index);
  ChoiceResult& c = ex->choices[k];
  // With tools, the text that is a call leaves the content (tool_calls.h).
  std::string text = ev.text, reason = ev.finish_reason;
  if (!ex->tools.empty()) {
    text = ex->tools[k].feed(ev.text);
    if (ev.finished) {
      ParsedReply reply = ex->tools[k].finish();
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
    const double t = now();
    if (ex->t_first == 0) ex->t_first = t;
    ex->t_last = t;
    ex->tokens += int64_t(ev.tokens.size());
    if (ex->last_token_at[k] > 0) metrics_->itl.add(t - ex->last_token_at[k]);
    ex->last_token_at[k] = t;
  }
  if (ex->stream && (!text.empty() || ev.finished || !ev.tokens.empty())) {
    // The engine holds back a character a token left incomplete until it completes (what
    // never does ends the choice, written as U+FFFD by the JSON writer).
    const bool first = !ex->started[k];
    ex->started[k] = true;
    if (!text.empty() || first || (ex->ctx.want_logprobs && !ev.tokens.empty()))
      ex->conn->stream(sse(stream_chunk(ex->ctx, int(k), text, &ev, "", first)));
    if (!c.tool_calls.empty())
      ex->conn->stream(sse(tool_calls_chunk(ex->ctx, int(k), c.tool_calls)));
    if (ev.finished && reason != "abort")
      ex->conn->stream(sse(stream_chunk(ex->ctx, int(k), "", nullptr, reason, false)));
  }
  if (ev.finished) {
    c.finish_reason = reason;
    c.usage = ev.usage;
    if (--ex->open == 0) finish(ex);
  }
}

void Server::finish(const std::shared_ptr<Exchange>& ex) {
  bool aborted = false;
  for (const ChoiceResult& c : ex->choices) aborted |= c.finish_reason == "abort";
  ex->done = true;
  ex->deadline->cancel();
  --in_flight_;
  std::shared_ptr<HttpConnection> conn = std::move(ex->conn);
  conn->on_gone = nullptr;
  // Cut short by the engine (its drain deadline passed, or a step failed): never an answer
  // that looks complete.
  const ApiError cut{503,
                     "the request was cancelled before it finished (the server is "
                     "shutting down, or the engine failed)",
                     "server_error", ""};
  auto& m = *metrics_;
  ++m.requests[aborted ? "abort" : "success"];
  for (const ChoiceResult& c : ex->choices) ++m.finished[c.finish_reason];
  m.e2e.add(now() - ex->t0);
  if (ex->t_first > 0) {
    m.ttft.add(ex->t_first - ex->t0);
    if (ex->tokens > 1) m.tpot.add((ex->t_last - ex->t_first) / double(ex->tokens - 1));
  }
  if (!ex->stream) {
    if (aborted) return send_error(*conn, cut);
    std::vector<ChoiceResult> choices = ex->choices;
    if (ex->echo)
      for (size_t k = 0; k < choices.size(); ++k)
        choices[k].text = decode(ex->prompts[k / size_t(ex->n)]) + choices[k].text;
    return send_json(*conn, 200, completion_response(ex->ctx, choices));
  }
  if (aborted)
    conn->stream(sse(cut.body()));
  else if (ex->include_usage)
    conn->stream(sse(usage_chunk(ex->ctx, total_usage(ex->choices, ex->n))));
  conn->stream("data: [DONE]\n\n");
  conn->end_stream();
}

}  // namespace loom::serve
