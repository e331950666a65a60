// The one scratch-directory helper for every test: a fresh directory made by mkdtemp under
// $TMPDIR (else /tmp), named loom_<tag>_XXXXXX, and removed with everything in it when the
// object goes out of scope. A failing gtest assertion returns from the test body, so the
// directory goes whether the test passes or fails; repeated runs leave nothing in /tmp.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace loom::test {

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    const char* env = std::getenv("TMPDIR");
    std::string root = env && *env ? env : "/tmp";
    std::string tmpl = root + "/loom_" + tag + "_XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;  // never throw from a destructor; a leftover is better than a crash
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string operator/(const std::string& name) const { return path + "/" + name; }
  const std::string& str() const { return path; }

  std::string path;
};

}  // namespace loom::test
