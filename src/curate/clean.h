// Text cleaning: invalid UTF-8 repaired, mojibake (UTF-8 read as cp1252/latin-1) reversed,
// Unicode NFC/NFKC normalisation (utf8proc), control characters dropped, whitespace and
// newlines normalised.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::curate {

struct CleanOptions {
  bool replace_invalid = true;  // invalid UTF-8 bytes -> U+FFFD (false: dropped)
  bool fix_mojibake = true;
  std::string normalize = "nfc";  // nfc | nfkc | none
  bool collapse_spaces = true;    // runs of spaces to one, lines trimmed at the end
  int max_blank_lines = 1;        // longer runs of empty lines are shortened
};

struct CleanCounts {
  int64_t invalid_bytes = 0, mojibake_fixes = 0, control_chars = 0;
  bool normalized_changed = false;
};

// Each step on its own (tests and other stages use them).
std::string repair_utf8(std::string_view s, bool replace, int64_t* invalid = nullptr);
// Reverses UTF-8 that was decoded as cp1252 or latin-1 and re-encoded ("CafÃ©" -> "Café",
// "itâ€™s" -> "it’s"), repeatedly for double encodings. Input must be valid UTF-8.
std::string fix_mojibake(std::string_view s, int64_t* fixes = nullptr);
std::string unicode_normalize(std::string_view s, const std::string& form);  // valid UTF-8 in
std::string clean_text(std::string_view s, const CleanOptions& opt, CleanCounts* counts = nullptr);

}  // namespace loom::curate
