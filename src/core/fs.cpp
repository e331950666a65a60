#include "core/fs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace loom {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), path, ": cannot open for reading (", std::strerror(errno), ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  LOOM_CHECK(!in.bad(), path, ": read error");
  return ss.str();
}

bool file_exists(const std::string& path) {
  return std::filesystem::exists(path);
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  LOOM_CHECK(!ec, path, ": cannot create directory (", ec.message(), ")");
}

void remove_all(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LOOM_CHECK(fd_ >= 0, tmp_, ": cannot create (", std::strerror(errno), ")");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    LOOM_CHECK(w > 0, tmp_, ": write failed (", std::strerror(errno), ")");
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void AtomicFile::commit() {
  LOOM_CHECK(fd_ >= 0, path_, ": committed twice");
  LOOM_CHECK(::fsync(fd_) == 0, tmp_, ": fsync failed (", std::strerror(errno), ")");
  ::close(fd_);
  fd_ = -1;
  LOOM_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, path_, ": rename failed (",
             std::strerror(errno), ")");
  fsync_dir(std::filesystem::path(path_).parent_path().string());
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOOM_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, ": cannot stat");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail(path, ": mmap failed (", std::strerror(errno), ")");
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

void MappedFile::release(size_t offset, size_t len) const {
  if (!data_ || offset >= size_) return;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t end = std::min(size_, offset + len);
  const size_t first = (offset + page - 1) / page * page, last = end / page * page;
  if (last > first) ::madvise(const_cast<uint8_t*>(data_) + first, last - first, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace loom
