// Shared pieces of the fuzz entry points (tests/fuzz/*.cpp). Each entry point feeds one input
// to one parser and accepts exactly one outcome for bad bytes: a loom::Error. Anything else (a
// crash, a sanitizer report, another exception type, an allocation past libFuzzer's
// -malloc_limit_mb) is a bug that the fuzzer reports and the replay test catches.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"

namespace loom::fuzz {

// Parsers that read files get the input through a scratch folder: one per process (libFuzzer
// runs inputs one after another in one process) under $LOOM_FUZZ_SCRATCH when set (fuzz.sh
// sets and removes it: libFuzzer ends with _Exit, which skips atexit), else under /dev/shm or
// the temp folder, removed at a normal exit (the replay executables).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* env = std::getenv("LOOM_FUZZ_SCRATCH");
    std::filesystem::path base = env && *env ? std::filesystem::path(env)
                                 : std::filesystem::is_directory("/dev/shm")
                                     ? "/dev/shm"
                                     : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("loom_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  // Registered once `dir` is constructed, so the handler runs before `dir` is destroyed.
  static const bool cleanup_registered = [] {
    return std::atexit([] {
             std::error_code ec;
             std::filesystem::remove_all(dir, ec);
           }) == 0;
  }();
  (void)cleanup_registered;
  return dir;
}

// A fresh, empty folder under the scratch folder for one input.
inline std::filesystem::path fresh_dir(const std::string& name) {
  std::filesystem::path d = scratch_dir() / name;
  std::error_code ec;
  std::filesystem::remove_all(d, ec);
  std::filesystem::create_directories(d);
  return d;
}

inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Inputs that hold several files separate them with this line, so one input names them all
// and the seeds stay readable.
inline constexpr std::string_view kPartSeparator = "\n#--loom-fuzz-part--#\n";

// Exactly n parts: the first n-1 separators split, missing parts are empty.
inline std::vector<std::string_view> split_parts(std::string_view data, size_t n) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    size_t at = data.find(kPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + kPartSeparator.size());
  }
  parts.push_back(data);
  parts.resize(n);
  return parts;
}

}  // namespace loom::fuzz
