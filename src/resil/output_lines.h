// The supervisor's reading of the launcher's output (every rank's stdout and stderr): bytes cut
// into lines of bounded length, and the few facts it takes from a line (the rank of a
// `mpirun --tag-output` tag, a rank's own error message, the rank mpirun's failure report
// names). Hand-written scanners, linear in the line: a rank may print anything (megabytes
// without a newline, binary), and the supervisor must never fail on what it reads.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

namespace loom::resil {

// Longest line the supervisor handles as one: a longer one is cut into pieces of at most this
// many bytes (at a UTF-8 character boundary where the bytes are UTF-8), each handled as a line.
inline constexpr size_t kMaxOutputLine = 64 * 1024;

// Cuts a byte stream into lines. Memory stays below max_line plus the largest chunk fed.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = kMaxOutputLine) : max_(max_line < 4 ? 4 : max_line) {}

  // Appends bytes and calls emit(line, continued) for every complete line (without its '\n')
  // and every max_line piece of a longer one; `continued` is true for the pieces after the
  // first of a cut line.
  template <typename Emit>
  void feed(std::string_view bytes, Emit&& emit);
  // End of the stream: the bytes after the last newline, if any.
  template <typename Emit>
  void finish(Emit&& emit);

 private:
  size_t cut_at(size_t start) const;
  size_t max_;
  std::string buf_;
  bool continued_ = false;  // the next piece continues a line cut at the bound
};

// "[1,3]<stdout>:text" (mpirun --tag-output) -> 3 and *text = "text"; -1 (and *text = line)
// for any other line.
int untag(std::string_view line, std::string_view* text);

// "... loom: rank N failed: MESSAGE" anywhere in the line (the trainer's last words before
// MPI_Abort) -> true, *rank = N, *message = MESSAGE.
bool rank_failed_message(std::string_view text, int* rank, std::string_view* message);

// "loom CMD: error: MESSAGE" or "loom CMD: internal error: MESSAGE" at the start of the line
// (a command's error exit) -> true, *message = MESSAGE.
bool command_error_message(std::string_view text, std::string_view* message);

// The rank in mpirun's failure report: "process rank N" or "Process name: [[A,B],N]".
bool mpi_reported_rank(std::string_view text, int* rank);

// `s` with every byte that is not part of well-formed UTF-8 replaced by U+FFFD, and cut to at
// most max_bytes (whole characters): what a rank printed, made fit for a JSON event.
std::string printable_utf8(std::string_view s, size_t max_bytes);

template <typename Emit>
void LineSplitter::feed(std::string_view bytes, Emit&& emit) {
  buf_.append(bytes.data(), bytes.size());
  size_t start = 0;
  for (;;) {
    const char* nl =
        static_cast<const char*>(std::memchr(buf_.data() + start, '\n', buf_.size() - start));
    const size_t end = nl ? size_t(nl - buf_.data()) : buf_.size();
    while (end - start > max_) {  // too long (complete or not): its pieces
      size_t cut = cut_at(start);
      emit(std::string_view(buf_).substr(start, cut - start), continued_);
      continued_ = true;
      start = cut;
    }
    if (!nl) break;
    emit(std::string_view(buf_).substr(start, end - start), continued_);
    continued_ = false;
    start = end + 1;
  }
  buf_.erase(0, start);
}

template <typename Emit>
void LineSplitter::finish(Emit&& emit) {
  feed({}, emit);
  if (!buf_.empty()) emit(std::string_view(buf_), continued_);
  buf_.clear();
  continued_ = false;
}

}  // namespace loom::resil
