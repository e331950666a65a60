#include "data/line_reader.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace loom::data {

LineBlockReader::LineBlockReader(std::vector<std::string> paths, size_t block_bytes,
                                 size_t max_line_bytes)
    : paths_(std::move(paths)), block_bytes_(block_bytes), max_line_bytes_(max_line_bytes) {
  LOOM_CHECK(!paths_.empty(), "no input files");
  for (auto& p : paths_) {
    struct stat st {};
    LOOM_CHECK(::stat(p.c_str(), &st) == 0, p, ": cannot open (", std::strerror(errno), ")");
    LOOM_CHECK(S_ISREG(st.st_mode), p, ": not a regular file");
    total_ += uint64_t(st.st_size);
  }
}

LineBlockReader::~LineBlockReader() {
  if (f_) std::fclose(f_);
}

bool LineBlockReader::open_next() {
  if (file_ >= paths_.size()) return false;
  f_ = std::fopen(paths_[file_].c_str(), "rb");
  LOOM_CHECK(f_, paths_[file_], ": cannot open (", std::strerror(errno), ")");
  line_ = 1;
  carry_.clear();
  return true;
}

bool LineBlockReader::next(LineBlock& out) {
  while (true) {
    if (!f_ && !open_next()) return false;
    std::string buf = std::move(carry_);
    carry_.clear();
    size_t have = buf.size();
    buf.resize(have + block_bytes_);
    size_t got = std::fread(buf.data() + have, 1, block_bytes_, f_);
    LOOM_CHECK(!std::ferror(f_), paths_[file_], ": read error");
    read_ += got;
    buf.resize(have + got);
    bool eof = got < block_bytes_;
    if (!eof) {
      // The carried part holds no newline, so only the bytes just read are searched (searching
      // the whole buffer made a long line cost the square of its length).
      const void* nl = got > 0 ? ::memrchr(buf.data() + have, '\n', got) : nullptr;
      if (!nl) {  // a line longer than the block: keep reading, up to the bound
        LOOM_CHECK(buf.size() <= max_line_bytes_, paths_[file_], ":", line_, ": line longer than ",
                   max_line_bytes_, " bytes (too_large)");
        carry_ = std::move(buf);
        continue;
      }
      const size_t last_nl = static_cast<size_t>(static_cast<const char*>(nl) - buf.data());
      carry_ = buf.substr(last_nl + 1);
      buf.resize(last_nl + 1);
    } else {
      std::fclose(f_);
      f_ = nullptr;
      ++file_;
      if (buf.empty()) continue;
      --file_;  // report this block as the file it came from
    }
    out.file = file_;
    out.first_line = line_;
    out.seq = seq_++;
    for (char c : buf) line_ += (c == '\n');
    out.text = std::move(buf);
    if (eof) ++file_;
    return true;
  }
}

}  // namespace loom::data
