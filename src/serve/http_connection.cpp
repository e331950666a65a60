#include "serve/http_connection.h"

#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <chrono>
#include <sstream>

#include "core/error.h"
#include "serve/openai_api.h"

namespace loom::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// Bytes a client may send past its request while the answer is being written (pipelining);
// more than this is not a client waiting for its answer.
constexpr size_t kMaxPipelined = 64 << 10;

}  // namespace

HttpConnection::HttpConnection(net::ip::tcp::socket socket, const ConnectionLimits& limits,
                               const Handler& handler)
    : stream_(std::move(socket)), limits_(limits), handler_(handler) {}

void HttpConnection::start() {
  read_request();
}

void HttpConnection::read_request() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(limits_.max_body_bytes);
  parser_->header_limit(64 << 10);
  // One deadline for the whole request: a client sending its head a byte at a time does not
  // earn more time by each byte (a deadline per read would).
  stream_.expires_after(seconds(limits_.read_timeout));
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_head(ec); });
}

void HttpConnection::on_head(beast::error_code ec) {
  if (ec) return on_request(ec);
  const auto& head = parser_->get();
  if (beast::iequals(head[http::field::expect], "100-continue")) {
    // curl asks before sending a body past 1 KB: answered at once rather than making it wait
    // out its own timeout.
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    net::async_write(
        stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code e, size_t) {
          if (e) return self->fail();
          http::async_read(self->stream_, self->buffer_, *self->parser_,
                           [self](beast::error_code e2, size_t) { self->on_request(e2); });
        });
    return;
  }
  http::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code e, size_t) { self->on_request(e); });
}

void HttpConnection::on_request(beast::error_code ec) {
  if (closed_) return;
  if (ec == http::error::body_limit)
    return answer_parse_error(413, cat("request body larger than ", limits_.max_body_bytes,
                                       " bytes (loom serve --max-body-mb)"));
  if (ec == http::error::header_limit)
    return answer_parse_error(431, "request header larger than 65536 bytes");
  if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
      ec == net::error::operation_aborted || ec == net::error::connection_reset ||
      ec == net::error::eof || ec == net::error::broken_pipe)
    return fail();  // nobody to answer: the client left or never finished its request
  if (ec) return answer_parse_error(400, cat("malformed HTTP request: ", ec.message()));
  request_ = parser_->release();
  keep_alive_ = request_.keep_alive();
  version_ = static_cast<int>(request_.version());
  answering_ = true;
  watch();
  handler_(shared_from_this(), request_);
}

void HttpConnection::answer_parse_error(int status, const std::string& message) {
  keep_alive_ = false;  // the rest of what it sent cannot be read as a request
  answering_ = true;
  respond(status, "application/json", ApiError{status, message}.body().dump());
}

void HttpConnection::watch() {
  if (watching_ || closed_) return;
  watching_ = true;
  stream_.expires_never();  // the read timer; writes set their own deadline
  stream_.async_read_some(
      buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
        self->watching_ = false;
        if (self->closed_) return;
        if (ec == net::error::operation_aborted && self->read_after_) {
          self->read_after_ = false;
          return self->read_request();
        }
        if (ec) return self->fail();  // hung up or reset while its answer was being made
        self->buffer_.commit(n);
        if (self->read_after_) {
          self->read_after_ = false;
          return self->read_request();
        }
        if (!self->answering_) return self->read_request();
        if (self->buffer_.size() > kMaxPipelined) return self->fail();
        self->watch();
      });
}

void HttpConnection::respond(int status, const std::string& content_type, std::string body,
                             const std::vector<std::pair<std::string, std::string>>& headers) {
  if (closed_ || !answering_) return;
  on_gone = nullptr;
  http::response<http::string_body> res{static_cast<http::status>(status), unsigned(version_)};
  res.set(http::field::server, "loom");
  res.set(http::field::content_type, content_type);
  for (const auto& [k, v] : headers) res.set(k, v);
  res.keep_alive(keep_alive_);
  res.body() = std::move(body);
  res.prepare_payload();
  std::ostringstream os;
  os << res;
  send(os.str(), true);
}

void HttpConnection::begin_stream(const std::string& content_type) {
  if (closed_ || !answering_) return;
  if (version_ < 11) keep_alive_ = false;  // HTTP/1.0 has no chunks: the body ends at close
  std::string head =
      cat("HTTP/1.1 200 OK\r\nServer: loom\r\nContent-Type: ", content_type,
          "\r\nCache-Control: no-cache\r\n", version_ >= 11 ? "Transfer-Encoding: chunked\r\n" : "",
          "Connection: ", keep_alive_ ? "keep-alive" : "close", "\r\n\r\n");
  send(std::move(head), false);
}

void HttpConnection::stream(std::string data) {
  if (closed_ || data.empty()) return;
  if (version_ < 11) return send(std::move(data), false);
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  send(size + data + "\r\n", false);
}

void HttpConnection::end_stream() {
  if (closed_) return;
  on_gone = nullptr;
  send(version_ >= 11 ? "0\r\n\r\n" : "", true);
}

void HttpConnection::send(std::string bytes, bool last) {
  if (!bytes.empty()) out_.push_back(std::move(bytes));
  if (last) close_after_ = true;
  write_next();
}

void HttpConnection::write_next() {
  if (writing_ || closed_) return;
  if (out_.empty()) {
    if (!close_after_) return;
    // The answer is written: the next request, or the end of the connection.
    close_after_ = false;
    answering_ = false;
    if (!keep_alive_) {
      beast::error_code ignored;
      stream_.socket().shutdown(net::ip::tcp::socket::shutdown_send, ignored);
      closed_ = true;
      stream_.close();
      return;
    }
    if (watching_) {
      // Stop watching to read the next request under the read deadline (an idle kept-alive
      // connection times out too); a cancelled read loses no bytes.
      read_after_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
    } else {
      read_request();
    }
    return;
  }
  auto bytes = std::make_shared<std::string>();
  for (std::string& s : out_) *bytes += s;
  out_.clear();
  writing_ = true;
  // A client that stops reading fills the socket's buffers: past this deadline it is dropped.
  stream_.expires_after(seconds(limits_.write_timeout));
  net::async_write(stream_, net::buffer(*bytes),
                   [self = shared_from_this(), bytes](beast::error_code ec, size_t) {
                     self->writing_ = false;
                     if (ec) return self->fail();
                     self->write_next();
                   });
}

void HttpConnection::close() {
  fail();
}

void HttpConnection::fail() {
  if (closed_) return;
  closed_ = true;
  stream_.close();
  if (on_gone) {
    auto gone = std::move(on_gone);
    on_gone = nullptr;
    gone();
  }
}

}  // namespace loom::serve
