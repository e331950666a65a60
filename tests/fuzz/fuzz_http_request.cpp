// loom serve's HTTP request parsing: the bytes a client sends on a connection (request line,
// headers, Content-Length or chunked bodies, keep-alive pipelining), read by Boost.Beast's
// request parser with the limits loom serve's connections set (serve/http_connection.cpp),
// then routed to what parses bodies as loom serve's handlers do (serve/openai_api.h for the
// completions endpoints, the {"tokens": [...]} shape of /detokenize). Any bytes end in a
// request handled or refused; a crash, a hang (libFuzzer -timeout), a handler error other
// than the API's 4xx, or an error body that is not valid UTF-8 is a finding.
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/json.h"
#include "core/utf8.h"
#include "serve/openai_api.h"

namespace {

namespace http = boost::beast::http;

void handle(const http::request<http::string_body>& req) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    try {
      (void)loom::serve::parse_request(req.body(), path == "/v1/chat/completions", 0);
    } catch (const loom::serve::ApiError& e) {
      if (e.status < 400 || e.status >= 500) __builtin_trap();
      const std::string out = e.body().dump();
      if (loom::utf8_lossy(out) != out) __builtin_trap();
    }
  } else if (path == "/detokenize") {
    try {
      loom::Json j = loom::Json::parse(req.body(), "request body");
      if (j.is_object() && j.contains("tokens") && j.at("tokens").is_array())
        for (const loom::Json& t : j.at("tokens").as_array())
          if (t.type() == loom::Json::Type::Int) (void)t.as_int();
    } catch (const loom::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  // Requests one after another on the connection until the bytes end or one closes it
  // (bounded: each request consumes bytes).
  for (int i = 0; i < 64 && pos < size; ++i) {
    http::request_parser<http::string_body> p;
    p.header_limit(64 << 10);
    p.body_limit(1 << 20);
    p.eager(true);
    boost::beast::error_code ec;
    while (!p.is_done()) {
      const size_t n = p.put(boost::asio::buffer(data + pos, size - pos), ec);
      pos += n;
      if (ec == http::error::need_more && n > 0) {
        ec = {};
        continue;
      }
      if (ec == http::error::need_more) p.put_eof(ec);
      break;
    }
    if (ec || !p.is_done()) return 0;
    handle(p.get());
    if (!p.get().keep_alive()) return 0;
  }
  return 0;
}
