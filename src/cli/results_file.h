// The output of `loom generate --input ... --output OUT`: one JSONL line per prompt, in input
// order, appended as results finish, so that a rerun skips the prompts already answered.
// Only a regular file has earlier results to skip: a pipe, a terminal or a device
// (/dev/stdout, /dev/full) is written from the first prompt and never read, since reading
// one would block or never end. The earlier lines are counted in a fixed buffer, not read
// whole, and a line cut by a crash is removed before appending. A failed write (a full disk)
// throws at once, naming the file.
#pragma once

#include <cstdio>
#include <string>

namespace loom::cli {

class ResultsFile {
 public:
  explicit ResultsFile(const std::string& path);
  ~ResultsFile();
  ResultsFile(const ResultsFile&) = delete;
  ResultsFile& operator=(const ResultsFile&) = delete;

  // Complete lines the file held when opened (0 for anything but a regular file).
  size_t done() const { return done_; }
  void write_line(const std::string& line);  // appends line + '\n'
  void flush();                              // throws loom::Error on a failed write
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  size_t done_ = 0;
};

}  // namespace loom::cli
