// Reads a list of text files as blocks of whole lines, remembering which file and line each
// block starts at, so parallel workers can report "file:line" and memory stays bounded by
// the block size however large the files are.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace loom::data {

struct LineBlock {
  size_t file = 0;         // index into the reader's paths
  int64_t first_line = 1;  // 1-based line number of the block's first line
  uint64_t seq = 0;        // 0, 1, 2, ... across all files
  std::string text;        // whole lines; the last may lack its '\n' at end of file
};

class LineBlockReader {
 public:
  // A line longer than max_line_bytes is an error naming its file and line (too_large): one
  // line is held whole, so without a bound a file with no newline is held whole.
  static constexpr size_t kDefaultMaxLineBytes = size_t{256} << 20;
  explicit LineBlockReader(std::vector<std::string> paths, size_t block_bytes = 1 << 20,
                           size_t max_line_bytes = kDefaultMaxLineBytes);
  ~LineBlockReader();
  LineBlockReader(const LineBlockReader&) = delete;
  LineBlockReader& operator=(const LineBlockReader&) = delete;

  bool next(LineBlock& out);  // false when every file is read
  const std::string& path(size_t file) const { return paths_[file]; }
  const std::vector<std::string>& paths() const { return paths_; }
  uint64_t total_bytes() const { return total_; }
  uint64_t bytes_read() const { return read_; }

 private:
  bool open_next();
  std::vector<std::string> paths_;
  size_t block_bytes_;
  size_t max_line_bytes_;
  size_t file_ = 0;
  FILE* f_ = nullptr;
  std::string carry_;  // a partial line left from the previous read (never holds a '\n')
  int64_t line_ = 1;
  uint64_t seq_ = 0, total_ = 0, read_ = 0;
};

// Calls f(line, line_number) for each line of a block (without its '\n' or '\r\n').
template <typename F>
void for_each_line(const LineBlock& b, F&& f) {
  int64_t line_no = b.first_line;
  std::string_view t = b.text;
  size_t pos = 0;
  while (pos < t.size()) {
    size_t eol = t.find('\n', pos);
    if (eol == std::string_view::npos) eol = t.size();
    std::string_view line = t.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    f(line, line_no++);
    pos = eol + 1;
  }
}

}  // namespace loom::data
