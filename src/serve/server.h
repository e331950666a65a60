// `loom serve`: an OpenAI-compatible HTTP server over the serving engine. Endpoints: POST
// /v1/completions, POST /v1/chat/completions (streamed with server-sent events when asked), GET
// /v1/models, POST /v1/embeddings, GET /health (503 while loading or draining), GET /metrics
// (Prometheus text), POST /tokenize, POST /detokenize. Connections are event-driven
// (serve/http_connection.h) on one I/O thread, so thousands of open streams cost no thread each;
// requests queue in the engine up to its max_queue, past which they get 429 with Retry-After. A
// client that disconnects cancels its request at once; every wait has a deadline.
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine_api.h"
#include "serve/http_connection.h"
#include "serve/openai_api.h"

namespace loom::serve {

class StructuredOutputs;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (see bind())
  std::string model_name = "loom";  // what responses report
  // Further names a request's `model` may give (vLLM's --served-model-name after the first);
  // /v1/models lists model_name, then these.
  std::vector<std::string> model_aliases;
  // max_tokens of a request that gives none: the context left after its prompt, capped by this
  // when it is > 0 (as vLLM's --max-tokens of its generation config).
  int default_max_tokens = 0;
  double request_timeout_seconds = 600;
  int max_seq = 0;  // the model's context length (reported, and the default max_tokens's bound)
  // A request body past this is refused with 413 before it is read.
  size_t max_body_bytes = size_t(16) << 20;
  double read_timeout_seconds = 30;   // a whole request (head and body), and a kept-alive idle
  double write_timeout_seconds = 30;  // each write to a client that has stopped reading
  int retry_after_seconds = 1;        // the Retry-After of a 429
  // /v1/embeddings: the model's width (a request's `dimensions` must equal it) and how the
  // engine pools and normalises.
  int embedding_dimensions = 0;
  infer::EmbeddingOptions embedding;
};

class Server {
 public:
  // tok nullable: a byte-level model (text is bytes). chat nullable: chat completions refused.
  Server(infer::Engine& engine, const data::BpeTokenizer* tok, const data::ChatTemplate* chat,
         const ServerOptions& opt);
  ~Server();
  int bind();  // binds and listens; returns the port
  void run();  // serves on this thread until stop()
  // Stops serving (any thread). With a grace period, first stops accepting and waits up to
  // that long for the requests being answered to be written out.
  void stop(double grace_seconds = 0);
  void set_ready(bool ready) { ready_ = ready; }
  // Shutting down: /health answers 503 "draining" and new generation requests get 503, while
  // those in flight finish.
  void set_draining() { draining_ = true; }

  struct Metrics;
  struct Exchange;

 private:
  void handle(const std::shared_ptr<HttpConnection>& c, const HttpRequest& req);
  void generate(bool chat, const std::shared_ptr<HttpConnection>& c, const HttpRequest& req);
  // Hands a parsed request (its constraint compiled) to the engine, on the I/O thread.
  void submit(bool chat, const std::shared_ptr<HttpConnection>& c, ApiRequest r,
              std::vector<std::vector<int32_t>> prompts);
  void embeddings(const std::shared_ptr<HttpConnection>& c, const HttpRequest& req);
  // The engine's refusal of a request: 429 with Retry-After, or its status naming `param`
  // for a 400; counted in the metrics.
  void send_rejection(HttpConnection& c, const infer::RequestRejected& e, const std::string& param);
  void on_event(const std::shared_ptr<Exchange>& ex, const infer::TokenEvent& ev);
  void finish(const std::shared_ptr<Exchange>& ex);
  void give_up(const std::shared_ptr<Exchange>& ex, const std::string& outcome);
  std::string metrics_text() const;
  // Throws ApiError 404 (model_not_found) unless `model` is empty or one of the served names.
  void check_model(const std::string& model) const;
  void accept();
  std::vector<int32_t> encode(const std::string& text) const;
  StructuredOutputs& structured();  // built on first use: the vocabulary's trie
  std::string decode(const std::vector<int32_t>& ids) const;

  infer::Engine& engine_;
  const data::BpeTokenizer* tok_;
  const data::ChatTemplate* chat_;
  ServerOptions opt_;
  // Shared with the engine's callbacks, which post their events onto it from the engine thread.
  std::shared_ptr<boost::asio::io_context> io_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor_;
  HttpConnection::Handler handler_;
  ConnectionLimits limits_;
  std::atomic<bool> ready_{false}, draining_{false};
  std::unique_ptr<Metrics> metrics_;   // touched on the I/O thread only
  std::atomic<int64_t> in_flight_{0};  // generation requests being answered
  int64_t next_id_ = 1;
  // Constraints are compiled on their own thread, so that a schema's compilation never holds
  // up the I/O thread's other connections.
  std::unique_ptr<boost::asio::thread_pool> compile_;
  std::once_flag structured_once_;
  std::unique_ptr<StructuredOutputs> structured_;
};

}  // namespace loom::serve
