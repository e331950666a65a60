#include "cli/results_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace loom::cli {

ResultsFile::ResultsFile(const std::string& path) : path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LOOM_CHECK(fd >= 0, "cannot read ", path, ": ", std::strerror(errno));
    char buf[1 << 16];
    off_t at = 0, complete = 0;  // bytes read; the end of the last complete line
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        LOOM_CHECK(n == 0, "cannot read ", path, ": ", std::strerror(err));
        break;
      }
      for (ssize_t i = 0; i < n; ++i)
        if (buf[i] == '\n') {
          ++done_;
          complete = at + i + 1;
        }
      at += n;
    }
    // A cut last line (a crash while writing it) is written again, whole.
    if (at > complete)
      LOOM_CHECK(::truncate(path.c_str(), complete) == 0, "cannot cut the partial last line of ",
                 path, ": ", std::strerror(errno));
  }
  f_ = std::fopen(path.c_str(), "a");
  LOOM_CHECK(f_, "cannot write ", path, ": ", std::strerror(errno));
}

ResultsFile::~ResultsFile() {
  if (f_) std::fclose(f_);
}

void ResultsFile::write_line(const std::string& line) {
  errno = 0;
  LOOM_CHECK(std::fwrite(line.data(), 1, line.size(), f_) == line.size() &&
                 std::fputc('\n', f_) != EOF,
             "cannot write ", path_, ": ", std::strerror(errno ? errno : EIO));
}

void ResultsFile::flush() {
  errno = 0;
  LOOM_CHECK(std::fflush(f_) == 0, "cannot write ", path_, ": ",
             std::strerror(errno ? errno : EIO));
}

}  // namespace loom::cli
