#include "resil/output_lines.h"

#include "core/utf8.h"

namespace loom::resil {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Reads 1 to 9 decimal digits at s[*pos] (no sign): a rank number. False when there are none
// or more than 9.
bool read_number(std::string_view s, size_t* pos, int* out) {
  size_t p = *pos;
  int v = 0;
  while (p < s.size() && is_digit(s[p]) && p - *pos < 9) v = v * 10 + (s[p++] - '0');
  if (p == *pos || (p < s.size() && is_digit(s[p]))) return false;
  *pos = p;
  *out = v;
  return true;
}

bool read_literal(std::string_view s, size_t* pos, std::string_view lit) {
  if (s.substr(*pos, lit.size()) != lit) return false;
  *pos += lit.size();
  return true;
}

// Length of the well-formed UTF-8 character at s[i] (RFC 3629: no overlongs, no surrogates,
// nothing past U+10FFFF); 0 when the bytes there are not one.
size_t utf8_char_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = c >= 0xC2 && c <= 0xDF   ? 2
             : c >= 0xE0 && c <= 0xEF ? 3
             : c >= 0xF0 && c <= 0xF4 ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && b(1) < 0xA0) || (c == 0xED && b(1) > 0x9F) || (c == 0xF0 && b(1) < 0x90) ||
      (c == 0xF4 && b(1) > 0x8F))
    return 0;
  return n;
}

}  // namespace

size_t LineSplitter::cut_at(size_t start) const {
  size_t cut = start + max_;
  // Not inside a UTF-8 character: back over at most 3 continuation bytes.
  for (int k = 0; k < 3 && (static_cast<unsigned char>(buf_[cut]) & 0xC0) == 0x80; ++k) --cut;
  return (static_cast<unsigned char>(buf_[cut]) & 0xC0) == 0x80 ? start + max_ : cut;
}

int untag(std::string_view line, std::string_view* text) {
  *text = line;
  size_t p = 0;
  int job = 0, rank = 0;
  if (!read_literal(line, &p, "[") || !read_number(line, &p, &job) ||
      !read_literal(line, &p, ",") || !read_number(line, &p, &rank) ||
      !read_literal(line, &p, "]<"))
    return -1;
  if (!read_literal(line, &p, "stdout>:") && !read_literal(line, &p, "stderr>:")) return -1;
  *text = line.substr(p);
  return rank;
}

bool rank_failed_message(std::string_view text, int* rank, std::string_view* message) {
  static constexpr std::string_view kHead = "loom: rank ";
  for (size_t at = text.find(kHead); at != std::string_view::npos; at = text.find(kHead, at + 1)) {
    size_t p = at + kHead.size();
    int r = 0;
    if (read_number(text, &p, &r) && read_literal(text, &p, " failed: ")) {
      *rank = r;
      *message = text.substr(p);
      return true;
    }
  }
  return false;
}

bool command_error_message(std::string_view text, std::string_view* message) {
  size_t p = 0;
  if (!read_literal(text, &p, "loom ")) return false;
  const size_t word = p;
  while (p < text.size() && text[p] != ':' && text[p] != ' ' && text[p] != '\t') ++p;
  if (p == word || !read_literal(text, &p, ": ")) return false;
  read_literal(text, &p, "internal ");
  if (!read_literal(text, &p, "error: ")) return false;
  *message = text.substr(p);
  return true;
}

bool mpi_reported_rank(std::string_view text, int* rank) {
  static constexpr std::string_view kRank = "process rank ", kName = "Process name: [[";
  for (size_t at = text.find(kRank); at != std::string_view::npos; at = text.find(kRank, at + 1)) {
    size_t p = at + kRank.size();
    if (read_number(text, &p, rank)) return true;
  }
  for (size_t at = text.find(kName); at != std::string_view::npos; at = text.find(kName, at + 1)) {
    size_t p = at + kName.size();
    int a = 0, b = 0;
    if (read_number(text, &p, &a) && read_literal(text, &p, ",") && read_number(text, &p, &b) &&
        read_literal(text, &p, "],") && read_number(text, &p, rank) && read_literal(text, &p, "]"))
      return true;
  }
  return false;
}

std::string printable_utf8(std::string_view s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_char_length(s, i);
    size_t add = n ? n : 3;  // U+FFFD is 3 bytes
    if (out.size() + add > max_bytes) break;
    if (n)
      out.append(s.substr(i, n));
    else
      utf8_append(out, 0xFFFD);
    i += n ? n : 1;
  }
  return out;
}

}  // namespace loom::resil
