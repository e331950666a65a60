#include "curate/input.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "curate/text.h"

namespace loom::curate {
namespace {

class PlainSource : public ByteSource {
 public:
  explicit PlainSource(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LOOM_CHECK(fd_ >= 0, "cannot open ", path, ": ", std::strerror(errno));
  }
  ~PlainSource() override { ::close(fd_); }
  size_t read(char* buf, size_t n) override {
    for (;;) {
      ssize_t r = ::read(fd_, buf, n);
      if (r < 0 && errno == EINTR) continue;
      LOOM_CHECK(r >= 0, "read error in ", path_, ": ", std::strerror(errno));
      pos_ += static_cast<uint64_t>(r);
      return static_cast<size_t>(r);
    }
  }
  uint64_t position() const override { return pos_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t pos_ = 0;
};

// zlib's inflate with gzip header detection; handles multi-member files (one member per
// record, as Common Crawl writes WARC.gz).
class GzipSource : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : raw_(path), path_(path) {
    std::memset(&z_, 0, sizeof z_);
    LOOM_CHECK(inflateInit2(&z_, 15 + 32) == Z_OK, "zlib init failed for ", path);
    in_.resize(1 << 16);
  }
  ~GzipSource() override { inflateEnd(&z_); }
  size_t read(char* buf, size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(buf);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out == n) {
      if (z_.avail_in == 0) {
        if (raw_eof_) {
          LOOM_CHECK(!mid_member_, path_, ": truncated gzip stream (ends inside a member, after ",
                     consumed_, " compressed bytes)");
          break;
        }
        size_t r = raw_.read(in_.data(), in_.size());
        if (r == 0) {
          raw_eof_ = true;
          continue;
        }
        z_.next_in = reinterpret_cast<Bytef*>(in_.data());
        z_.avail_in = static_cast<uInt>(r);
      }
      uInt before = z_.avail_in;
      int rc = inflate(&z_, Z_NO_FLUSH);
      consumed_ += before - z_.avail_in;
      mid_member_ = true;
      if (rc == Z_STREAM_END) {
        mid_member_ = false;
        inflateReset(&z_);  // next gzip member, if any
      } else if (rc == Z_BUF_ERROR && z_.avail_in == 0) {
        continue;  // needs more input
      } else if (rc != Z_OK) {
        fail(path_, ": corrupt gzip data after ", consumed_, " compressed bytes (",
             z_.msg ? z_.msg : "zlib error", ")");
      }
    }
    return n - z_.avail_out;
  }
  uint64_t position() const override { return consumed_; }

 private:
  PlainSource raw_;
  std::string path_;
  z_stream z_;
  std::vector<char> in_;
  bool raw_eof_ = false, mid_member_ = false;
  uint64_t consumed_ = 0;
};

class ZstdSource : public ByteSource {
 public:
  explicit ZstdSource(const std::string& path) : raw_(path), path_(path) {
    ds_ = ZSTD_createDStream();
    ZSTD_initDStream(ds_);
    in_.resize(ZSTD_DStreamInSize());
  }
  ~ZstdSource() override { ZSTD_freeDStream(ds_); }
  size_t read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (ib_.pos == ib_.size) {
        size_t r = raw_.read(in_.data(), in_.size());
        if (r == 0) {
          LOOM_CHECK(last_ == 0, path_, ": truncated zstd stream after ", consumed_, " bytes");
          break;
        }
        ib_ = ZSTD_inBuffer{in_.data(), r, 0};
      }
      size_t before = ib_.pos;
      last_ = ZSTD_decompressStream(ds_, &out, &ib_);
      consumed_ += ib_.pos - before;
      LOOM_CHECK(!ZSTD_isError(last_), path_, ": corrupt zstd data after ", consumed_, " bytes (",
                 ZSTD_getErrorName(last_), ")");
    }
    return out.pos;
  }
  uint64_t position() const override { return consumed_; }

 private:
  PlainSource raw_;
  std::string path_;
  ZSTD_DStream* ds_ = nullptr;
  std::vector<char> in_;
  ZSTD_inBuffer ib_{nullptr, 0, 0};
  size_t last_ = 0;
  uint64_t consumed_ = 0;
};

}  // namespace

std::unique_ptr<ByteSource> open_source(const std::string& path) {
  if (ends_with(path, ".gz")) return std::make_unique<GzipSource>(path);
  if (ends_with(path, ".zst") || ends_with(path, ".zstd"))
    return std::make_unique<ZstdSource>(path);
  return std::make_unique<PlainSource>(path);
}

bool LineReader::fill() {
  if (eof_) return false;
  if (pos_ > 0) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  size_t old = buf_.size();
  buf_.resize(old + (1 << 16));
  size_t r;
  try {
    r = src_->read(buf_.data() + old, 1 << 16);
  } catch (...) {
    buf_.resize(old);  // keep consumed() true for a reader that reports the damage
    throw;
  }
  buf_.resize(old + r);
  filled_ += r;
  if (r == 0) eof_ = true;
  return r > 0;
}

bool LineReader::next(std::string& line, bool& too_long) {
  too_long = false;
  line.clear();
  size_t scanned = pos_;
  for (;;) {
    size_t nl = buf_.find('\n', scanned);
    if (nl != std::string::npos) {
      size_t len = nl - pos_;
      if (too_long) {
        // already holding the capped prefix; drop the rest of the line
      } else {
        line.assign(buf_, pos_, std::min(len, max_line_));
        too_long = len > max_line_;
      }
      pos_ = nl + 1;
      ++lineno_;
      return true;
    }
    // No newline in the buffer: keep at most max_line_ bytes of this line.
    if (!too_long && buf_.size() - pos_ > max_line_) {
      line.assign(buf_, pos_, max_line_);
      too_long = true;
    }
    if (too_long) {
      pos_ = buf_.size();  // discard what we have of the over-long line
    }
    scanned = buf_.size() - pos_;
    if (!fill()) {
      if (buf_.size() > pos_ || too_long) {
        if (!too_long) line.assign(buf_, pos_, std::string::npos);
        pos_ = buf_.size();
        ++lineno_;
        return true;
      }
      return false;
    }
    scanned = pos_ + scanned;  // fill() moved data to the front; resume the search
  }
}

size_t LineReader::read_exact(std::string& out, size_t n) {
  out.clear();
  while (out.size() < n) {
    if (pos_ >= buf_.size() && !fill()) break;
    size_t take = std::min(n - out.size(), buf_.size() - pos_);
    out.append(buf_, pos_, take);
    pos_ += take;
  }
  return out.size();
}

uint64_t LineReader::skip(uint64_t n) {
  uint64_t done = 0;
  while (done < n) {
    if (pos_ >= buf_.size() && !fill()) break;
    size_t take = static_cast<size_t>(std::min<uint64_t>(n - done, buf_.size() - pos_));
    pos_ += take;
    done += take;
  }
  return done;
}

}  // namespace loom::curate
