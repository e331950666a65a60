// resil/output_lines and resil/protocol: what the supervisor reads from the ranks. The input's
// first byte sets the line bound (1 to 256 bytes, so cuts happen often); the rest is fed in
// chunks whose sizes come from the bytes themselves. Every piece must respect the bound, the
// pieces and newlines must give back the input, the scanners must not fail, what they return
// must lie inside the line, and printable_utf8 must give valid, bounded UTF-8. Each piece is
// also read as a heartbeat, where loom::Error is the only accepted failure.
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "resil/output_lines.h"
#include "resil/protocol.h"

namespace {

bool inside(std::string_view part, std::string_view whole) {
  return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    size_t n = c < 0x80                 ? 1
               : c >= 0xC2 && c <= 0xDF ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t bound = 1 + data[0];
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  loom::resil::LineSplitter splitter(bound);
  std::string rebuilt;
  bool first = true;
  auto emit = [&](std::string_view piece, bool continued) {
    if (piece.size() > std::max<size_t>(bound, 4)) __builtin_trap();
    if (!first && !continued) rebuilt += '\n';
    first = false;
    rebuilt.append(piece);
    std::string_view text, msg;
    int rank = -1;
    int tagged = loom::resil::untag(piece, &text);
    if (!inside(text, piece) || tagged < -1) __builtin_trap();
    if (loom::resil::rank_failed_message(text, &rank, &msg) && (!inside(msg, text) || rank < 0))
      __builtin_trap();
    if (loom::resil::command_error_message(text, &msg) && !inside(msg, text)) __builtin_trap();
    if (loom::resil::mpi_reported_rank(text, &rank) && rank < 0) __builtin_trap();
    std::string shown = loom::resil::printable_utf8(piece, 64);
    if (shown.size() > 64 || !valid_utf8(shown)) __builtin_trap();
    try {
      loom::resil::decode(std::string(piece), "fuzz");
    } catch (const loom::Error&) {
    }
  };
  for (size_t pos = 0; pos < in.size();) {
    size_t n = 1 + static_cast<unsigned char>(in[pos]) % 97;
    splitter.feed(in.substr(pos, n), emit);
    pos += n;
  }
  splitter.finish(emit);
  // Newlines are gone; pieces joined at the cuts, lines at newlines: the input again, except a
  // trailing newline (which ends the last line) and empty pieces at cuts (never emitted).
  std::string expect(in);
  if (!expect.empty() && expect.back() == '\n') expect.pop_back();
  if (rebuilt != expect) __builtin_trap();
  return 0;
}
