// One client's TCP connection to `loom serve`, event-driven on Boost.Asio/Beast: no thread per
// connection, so thousands stay open at once. Every step has a deadline: the whole request (head
// and body, and the idle wait before it on a kept-alive connection) within read_timeout, every
// write within write_timeout; a client that misses one is dropped without holding up anyone.
// While a request is being answered the socket is still read, so a client that hangs up is
// noticed at once (its handler's on_gone runs). Everything here runs on the server's one I/O
// thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace loom::serve {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;

struct ConnectionLimits {
  double read_timeout = 10;   // seconds for a whole request (and for an idle kept-alive wait)
  double write_timeout = 30;  // seconds for each write to be taken by the client
  size_t max_body_bytes = size_t(16) << 20;
};

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  // Called once per request read; it answers with respond() or begin_stream() ... end_stream(),
  // now or later (on this thread).
  using Handler = std::function<void(const std::shared_ptr<HttpConnection>&, const HttpRequest&)>;

  HttpConnection(boost::asio::ip::tcp::socket socket, const ConnectionLimits& limits,
                 const Handler& handler);
  void start();
  void close();  // drops the connection now (its handler's on_gone runs if one is set)
  bool closed() const { return closed_; }

  // The whole response; extra headers as name/value pairs.
  void respond(int status, const std::string& content_type, std::string body,
               const std::vector<std::pair<std::string, std::string>>& headers = {});
  // A streamed 200 response (chunked transfer encoding): its head, then pieces, then the end.
  void begin_stream(const std::string& content_type);
  void stream(std::string data);
  void end_stream();

  // Runs once if the client goes away (hang-up, reset, a missed deadline) before the answer
  // was written; cleared by respond() and end_stream().
  std::function<void()> on_gone;

 private:
  void read_request();
  void on_head(boost::beast::error_code ec);
  void on_request(boost::beast::error_code ec);
  void watch();  // reads while a request is answered: a hang-up shows at once
  void send(std::string bytes, bool last);
  void write_next();
  void fail();
  void answer_parse_error(int status, const std::string& message);

  boost::beast::tcp_stream stream_;
  ConnectionLimits limits_;
  const Handler& handler_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  HttpRequest request_;
  bool keep_alive_ = false;
  bool answering_ = false;   // a request is being answered
  bool watching_ = false;    // watch()'s read is pending
  bool read_after_ = false;  // read the next request once watch()'s read returns
  bool closed_ = false;
  std::deque<std::string> out_;  // bytes to write, in order
  bool writing_ = false;
  bool close_after_ = false;  // the last piece of the answer is queued: then next request or close
  int version_ = 11;
};

}  // namespace loom::serve
