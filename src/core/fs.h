// Files: whole-file reads, atomic writes (temp name, fsync, rename, fsync dir) and read-only
// memory maps. Nothing Loom writes is ever visible half-written under its final name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

std::string read_file(const std::string& path);  // throws naming the path
bool file_exists(const std::string& path);
void make_dirs(const std::string& path);   // mkdir -p
void remove_all(const std::string& path);  // rm -rf (no error if missing)
void fsync_dir(const std::string& dir);

// Writes to "<path>.tmp.<pid>" and renames over `path` on commit(). Destroyed without commit,
// the temporary is removed and `path` is untouched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return written_; }
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

void write_file_atomic(const std::string& path, std::string_view contents);

// Read-only mmap of a whole file; many processes mapping one file share its page cache.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the resident pages wholly inside [offset, offset + len) from this process (they are
  // read from the file again if touched): a reader done with a range stops holding it.
  void release(size_t offset, size_t len) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace loom
