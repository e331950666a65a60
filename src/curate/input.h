// Byte streams from input files, decompressed on the fly by extension (.gz via zlib, .zst via
// zstd, anything else read as is), with line reading that caps line length so one enormous
// line cannot exhaust memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace loom::curate {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes; 0 at the end. Throws loom::Error naming the file on a corrupt or
  // truncated stream (after returning every byte that could be decoded).
  virtual size_t read(char* buf, size_t n) = 0;
  // Compressed bytes consumed so far (for progress), or raw bytes for plain files.
  virtual uint64_t position() const = 0;
};

std::unique_ptr<ByteSource> open_source(const std::string& path);

class LineReader {
 public:
  LineReader(std::unique_ptr<ByteSource> src, size_t max_line_bytes)
      : src_(std::move(src)), max_line_(max_line_bytes) {}
  // Next line without its '\n'. `too_long` is set when the line exceeded max_line_bytes: the
  // rest of it was skipped and `line` holds only its first max_line_bytes.
  bool next(std::string& line, bool& too_long);
  // Exactly n bytes (fewer only at the end of the stream).
  size_t read_exact(std::string& out, size_t n);
  // Passes over n bytes without keeping them; returns how many there were (fewer at the end).
  uint64_t skip(uint64_t n);
  uint64_t line_number() const { return lineno_; }
  uint64_t position() const { return src_->position(); }
  // Decompressed bytes handed out so far (lines with their '\n', read_exact, skip): what the
  // input really held, whatever its headers claimed.
  uint64_t consumed() const { return filled_ - (buf_.size() - pos_); }
  uint64_t buffered() const { return buf_.size() - pos_; }  // decoded, not yet handed out

 private:
  bool fill();
  std::unique_ptr<ByteSource> src_;
  size_t max_line_;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
  uint64_t lineno_ = 0;
  uint64_t filled_ = 0;  // bytes read from src_ into buf_
};

}  // namespace loom::curate
