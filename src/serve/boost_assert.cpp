// Boost's assertion handler for every target that includes Boost.Asio or Beast
// (BOOST_ENABLE_ASSERT_HANDLER, set by loom_beast). A failed assertion aborts with its
// expression and place, as BOOST_ASSERT's default does, except one that Beast states
// wrongly: parse_chunk_header's `n >= 5` also fails on a valid, partly received final
// chunk ("0\r\n" then "\r\n" in two reads), and the code after it handles that case by
// asking for more bytes (corrected upstream in Beast 1.86). Debian's Boost still has it.
#include <boost/assert.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

bool is_stale_beast_chunk_assert(const char* expr, const char* function, const char* file) {
  return std::strcmp(expr, "n >= 5") == 0 && std::strstr(function, "parse_chunk_header") &&
         std::strstr(file, "beast/http/impl/basic_parser.ipp");
}

[[noreturn]] void fail(const char* expr, const char* msg, const char* function, const char* file,
                       long line) {
  std::fprintf(stderr, "%s:%ld: %s: Boost assertion `%s' failed%s%s\n", file, line, function,
               expr, msg ? ": " : "", msg ? msg : "");
  std::abort();
}

}  // namespace

namespace boost {

void assertion_failed(char const* expr, char const* function, char const* file, long line) {
  if (is_stale_beast_chunk_assert(expr, function, file)) return;
  fail(expr, nullptr, function, file, line);
}

void assertion_failed_msg(char const* expr, char const* msg, char const* function,
                          char const* file, long line) {
  fail(expr, msg, function, file, line);
}

}  // namespace boost
