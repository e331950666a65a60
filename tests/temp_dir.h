// The one scratch-directory helper for every test: a fresh directory made by mkdtemp under
// $TMPDIR (else /tmp), named loom_<tag>_XXXXXX, and removed with everything in it when the
// object goes out of scope. A failing gtest assertion returns from the test body, so the
// directory goes whether the test passes or fails; repeated runs leave nothing in /tmp.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

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
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string operator/(const std::string& name) const { return path + "/" + name; }
  const std::string& str() const { return path; }

  std::string path;
};

// For helpers that hand out a path string to many call sites: the directory belongs to the
// running test and is removed when it ends, pass or fail (a gtest listener), or at exit.
namespace detail {
struct TestScoped : ::testing::EmptyTestEventListener {
  std::vector<std::string> paths;
  void OnTestEnd(const ::testing::TestInfo&) override { clear(); }
  void clear() {
    std::error_code ec;
    for (auto& p : paths) std::filesystem::remove_all(p, ec);
    paths.clear();
  }
  ~TestScoped() override { clear(); }
};
inline TestScoped& test_scoped() {
  // Owned by gtest's listener list once appended; a static fallback when no test is running.
  static TestScoped* owned = [] {
    auto* l = new TestScoped;
    ::testing::UnitTest::GetInstance()->listeners().Append(l);
    return l;
  }();
  return *owned;
}
}  // namespace detail

// Removes `path` (made by the caller, e.g. a name every MPI rank agrees on) when the test ends.
inline void remove_at_test_end(const std::string& path) {
  detail::test_scoped().paths.push_back(path);
}

// A fresh mkdtemp directory, loom_<tag>_XXXXXX, removed when the running test ends.
inline std::string scoped_dir(const std::string& tag) {
  TempDir t(tag);
  std::string path = std::move(t.path);
  t.path.clear();  // ownership passes to the test-end listener
  remove_at_test_end(path);
  return path;
}

// One directory for the running test, made on its first call and removed when it ends.
inline std::string this_test_dir() {
  static const ::testing::TestInfo* owner = nullptr;
  static std::string dir;
  const ::testing::TestInfo* now = ::testing::UnitTest::GetInstance()->current_test_info();
  if (dir.empty() || owner != now) {
    dir = scoped_dir(now ? now->name() : "test");
    owner = now;
  }
  return dir;
}

}  // namespace loom::test
