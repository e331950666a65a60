// The regular expressions of tokenizer.json (Split pre-tokenizers, Replace normalizers and
// decoders), run with PCRE2 where the build found it (Debian's libpcre2-dev) and with the
// meaning JavaScript's `u`-flag regexes give them, as transformers.js runs them: \s is
// JavaScript's white space (with U+FEFF, without U+0085), \d and \w are ASCII, and Hugging
// Face's case-insensitive contraction group is matched in ASCII only.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data {

bool hf_regex_available();

class HfRegex {
 public:
  // Throws naming `where` when the pattern does not compile or uses \S inside a class.
  HfRegex(const std::string& pattern, const std::string& where);
  ~HfRegex();
  HfRegex(const HfRegex&) = delete;
  HfRegex& operator=(const HfRegex&) = delete;

  // The [begin, end) byte ranges of every non-overlapping match in valid UTF-8 text, left to
  // right; after an empty match the search resumes one code point later.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8
};

// A literal string as a pattern that matches exactly it.
std::string hf_regex_quote(std::string_view literal);

}  // namespace loom::data
