#include "data/hf_regex.h"

#include "core/error.h"

#ifdef LOOM_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace loom::data {

namespace {

// JavaScript's \s: WhiteSpace and LineTerminator code points, as class members.
constexpr const char* kJsSpaceClass =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}\\x{FEFF}";

// transformers.js spells Hugging Face's (?i:...) contraction group without the modifier, so
// it stays ASCII (PCRE2's would also match U+017F and U+212A).
constexpr const char* kContractionsCi = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
constexpr const char* kContractionsAscii = "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";

std::string to_pcre2(const std::string& js, const std::string& where) {
  std::string re = js;
  for (size_t at = re.find(kContractionsCi); at != std::string::npos;
       at = re.find(kContractionsCi, at))
    re.replace(at, std::string_view(kContractionsCi).size(), kContractionsAscii);
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char e = re[++i];
      const std::string space = kJsSpaceClass;
      switch (e) {
        case 's':
          out += in_class ? space : "[" + space + "]";
          break;
        case 'S':
          LOOM_CHECK(!in_class, where, ": \\S inside a character class is not supported");
          out += "[^" + space + "]";
          break;
        case 'd':
          out += in_class ? "0-9" : "[0-9]";
          break;
        case 'D':
          LOOM_CHECK(!in_class, where, ": \\D inside a character class is not supported");
          out += "[^0-9]";
          break;
        case 'w':
          out += in_class ? "A-Za-z0-9_" : "[A-Za-z0-9_]";
          break;
        case 'W':
          LOOM_CHECK(!in_class, where, ": \\W inside a character class is not supported");
          out += "[^A-Za-z0-9_]";
          break;
        default:
          out += c;
          out += e;
      }
      continue;
    }
    if (c == '[' && !in_class)
      in_class = true;
    else if (c == ']' && in_class)
      in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string hf_regex_quote(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

#ifdef LOOM_HAVE_PCRE2

bool hf_regex_available() {
  return true;
}

HfRegex::HfRegex(const std::string& pattern, const std::string& where) {
  const std::string re = to_pcre2(pattern, where);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail(where, ": regex does not compile at offset ", off, ": ", reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // interpreted where JIT is unavailable
  code_ = code;
}

HfRegex::~HfRegex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

std::vector<std::pair<size_t, size_t>> HfRegex::find_all(std::string_view text) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  std::vector<std::pair<size_t, size_t>> out;
  const auto* s = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at <= text.size()) {
    // The first search checks the whole text is UTF-8 (PCRE2 reads past the end of a
    // truncated character otherwise); later ones resume at character boundaries of it.
    const int rc =
        pcre2_match(code, s, text.size(), at, at == 0 ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("regex match failed: ", reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    out.emplace_back(ov[0], ov[1]);
    at = ov[1];
    if (ov[0] == ov[1]) {  // empty: step over one code point
      if (at >= text.size()) break;
      ++at;
      while (at < text.size() && (uint8_t(text[at]) & 0xC0) == 0x80) ++at;
    }
  }
  pcre2_match_data_free(md);
  return out;
}

#else

bool hf_regex_available() {
  return false;
}

HfRegex::HfRegex(const std::string&, const std::string& where) {
  fail(where,
       ": this regex needs PCRE2, which this build did not find (scripts/setup.sh "
       "installs libpcre2-dev)");
}
HfRegex::~HfRegex() = default;
std::vector<std::pair<size_t, size_t>> HfRegex::find_all(std::string_view) const {
  return {};
}

#endif

}  // namespace loom::data
