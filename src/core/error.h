// Errors: one exception type carrying a message that names what went wrong and where.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Concatenates any streamable values: cat("bad shape ", n, " at ", file).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(cat(args...));
}

}  // namespace loom

// Checks a condition that depends on input (config, files, shapes); throws loom::Error.
#define LOOM_CHECK(cond, ...)               \
  do {                                      \
    if (!(cond)) ::loom::fail(__VA_ARGS__); \
  } while (0)
