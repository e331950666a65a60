// loom serve's HTTP request parsing: the bytes a client sends on a connection (request line,
// headers, Content-Length or chunked bodies, keep-alive pipelining), read by the same
// cpp-httplib server loom serve runs (Debian's compiled library), routed to handlers that
// parse bodies as loom serve's do (serve/openai_api.h for the completions endpoints, the
// {"tokens": [...]} shape of /detokenize). Any bytes end in a response or a closed
// connection; a crash, a hang (libFuzzer -timeout) or a handler exception other than the API's
// 4xx errors is a finding.
#include <httplib.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/json.h"
#include "serve/openai_api.h"

namespace {

// A connection whose reads return the fuzz input and whose writes are dropped.
class BytesStream : public httplib::Stream {
 public:
  BytesStream(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t n) override {
    n = std::min(n, size_ - pos_);
    std::memcpy(ptr, data_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char*, size_t n) override { return static_cast<ssize_t>(n); }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 1;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 8080;
  }
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

// process_request is protected: the fuzz target drives one connection's requests through it.
class FuzzServer : public httplib::Server {
 public:
  FuzzServer() {
    auto completions = [](bool chat) {
      return [chat](const httplib::Request& req, httplib::Response& res) {
        try {
          (void)loom::serve::parse_request(req.body, chat, 256);
          res.status = 200;
        } catch (const loom::serve::ApiError& e) {
          if (e.status < 400 || e.status >= 500) __builtin_trap();
          res.status = e.status;
        }
      };
    };
    Post("/v1/completions", completions(false));
    Post("/v1/chat/completions", completions(true));
    Post("/detokenize", [](const httplib::Request& req, httplib::Response& res) {
      try {
        loom::Json j = loom::Json::parse(req.body, "request body");
        if (j.is_object() && j.contains("tokens") && j.at("tokens").is_array())
          for (const loom::Json& t : j.at("tokens").as_array())
            if (t.type() == loom::Json::Type::Int) (void)t.as_int();
        res.status = 200;
      } catch (const loom::Error&) {
        res.status = 400;
      }
    });
    Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
    set_payload_max_length(1 << 20);
  }
  void serve(BytesStream& s) {
    // As httplib's keep-alive loop: requests one after another until the input is used up
    // or a request closes the connection (bounded: each request consumes bytes).
    for (int i = 0; i < 64; ++i) {
      bool closed = false;
      if (!process_request(s, /*close_connection=*/false, closed, nullptr) || closed) return;
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static FuzzServer server;
  BytesStream s(data, size);
  server.serve(s);
  return 0;
}
