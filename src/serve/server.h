// `loom serve`: an OpenAI-compatible HTTP server over the serving engine (cpp-httplib, as
// llama.cpp's server). Endpoints: POST /v1/completions, POST /v1/chat/completions (streamed
// with server-sent events when asked), GET /v1/models, GET /health (503 while loading), GET
// /metrics (Prometheus text), POST /tokenize, POST /detokenize. A client that disconnects
// cancels its request at once; every wait has a timeout.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine_api.h"

namespace httplib {
class Server;
}

namespace loom::serve {

class StructuredOutputs;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (see bind())
  std::string model_name = "loom";
  int default_max_tokens = 256;
  double request_timeout_seconds = 600;
  int max_seq = 0;  // the model's context length (reported, checked by the engine)
  // A request body past this is refused with 413 before it is buffered whole (cpp-httplib's
  // default is unlimited: one POST could take all memory).
  size_t max_body_bytes = size_t(16) << 20;
};

class Server {
 public:
  // tok nullable: a byte-level model (text is bytes). chat nullable: chat completions refused.
  Server(infer::Engine& engine, const data::BpeTokenizer* tok, const data::ChatTemplate* chat,
         const ServerOptions& opt);
  ~Server();
  int bind();  // binds the socket; returns the port
  void run();  // serves until stop()
  void stop();
  void set_ready(bool ready) { ready_ = ready; }

  struct Metrics;

 private:
  void routes();
  std::vector<int32_t> encode(const std::string& text) const;
  StructuredOutputs& structured();  // built on first use: the vocabulary's trie
  std::string decode(const std::vector<int32_t>& ids) const;
  infer::Engine& engine_;
  const data::BpeTokenizer* tok_;
  const data::ChatTemplate* chat_;
  ServerOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> ready_{false};
  std::unique_ptr<Metrics> metrics_;
  std::once_flag structured_once_;
  std::unique_ptr<StructuredOutputs> structured_;
  std::atomic<int64_t> next_id_{1};
  std::atomic<int> in_flight_{0};          // generation requests being answered
  int socket_ = -1;                        // the listening socket (for its backlog)
  static constexpr int kMaxInFlight = 60;  // of 64 HTTP workers: 4 stay for /health, /metrics
};

}  // namespace loom::serve
