#include "infer/constrain/regex_parser.h"

#include <string>

#include "core/error.h"

namespace loom::infer::constrain {

namespace {

const CpRanges kDigit{{'0', '9'}};
const CpRanges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CpRanges kSpace{{'\t', '\r'}, {' ', ' '}};

class Parser {
 public:
  Parser(std::string_view p, const CharEncoder& enc) : p_(p), enc_(enc) {}

  ParsedRegex parse() {
    ParsedRegex out;
    if (peek('^')) {
      ++i_;
      out.anchored_start = true;
    }
    out.rx = alternation();
    if (i_ < p_.size() && p_[i_] == '$') {
      ++i_;
      out.anchored_end = true;
    }
    if (i_ < p_.size()) fail(p_[i_] == ')' ? "unbalanced ')'" : "'$' or '^' inside the pattern");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(cat("regex: ", what, " at offset ", i_));
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }
  bool at_end_anchor() const { return peek('$') && i_ + 1 == p_.size(); }

  Rx alternation() {
    std::vector<Rx> alts{sequence()};
    while (peek('|')) {
      ++i_;
      alts.push_back(sequence());
    }
    return rx_alt(std::move(alts));
  }

  Rx sequence() {
    std::vector<Rx> parts;
    while (i_ < p_.size() && !peek('|') && !peek(')') && !at_end_anchor())
      parts.push_back(quantified(atom()));
    return rx_seq(std::move(parts));
  }

  int number() {
    if (i_ >= p_.size() || p_[i_] < '0' || p_[i_] > '9') fail("expected a number in {}");
    long v = 0;
    while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + (p_[i_++] - '0');
      if (v > 1000) fail("a repetition count above 1000");
    }
    return static_cast<int>(v);
  }

  Rx quantified(Rx r) {
    while (i_ < p_.size()) {
      int lo, hi;
      const char c = p_[i_];
      if (c == '*') {
        lo = 0, hi = -1;
        ++i_;
      } else if (c == '+') {
        lo = 1, hi = -1;
        ++i_;
      } else if (c == '?') {
        lo = 0, hi = 1;
        ++i_;
      } else if (c == '{') {
        ++i_;
        lo = number();
        hi = lo;
        if (peek(',')) {
          ++i_;
          hi = peek('}') ? -1 : number();
        }
        if (!peek('}')) fail("expected '}'");
        ++i_;
        if (hi >= 0 && hi < lo) fail("a repetition {n,m} with m < n");
      } else {
        return r;
      }
      if (peek('?'))
        ++i_;  // lazy: the same language
      else if (peek('+'))
        fail("a possessive quantifier");
      r = rx_rep(std::move(r), lo, hi);
    }
    return r;
  }

  // One code point of the pattern's UTF-8.
  uint32_t code_point() {
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    const int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i_ + size_t(n) > p_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(p_[i_ + size_t(k)]);
      if ((d & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (d & 0x3F);
    }
    i_ += size_t(n);
    return cp;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      if (i_ >= p_.size() || !isxdigit(static_cast<unsigned char>(p_[i_])))
        fail(cat("expected ", digits, " hex digits"));
      const char h = p_[i_];
      v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }

  // After a backslash: a class (\d ...) or one code point. `in_class` allows \b as backspace.
  CpRanges escape(bool in_class) {
    if (i_ >= p_.size()) fail("a trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd':
        return kDigit;
      case 'D':
        return cp_negate(kDigit);
      case 'w':
        return kWord;
      case 'W':
        return cp_negate(kWord);
      case 's':
        return kSpace;
      case 'S':
        return cp_negate(kSpace);
      case 'n':
        return {{'\n', '\n'}};
      case 't':
        return {{'\t', '\t'}};
      case 'r':
        return {{'\r', '\r'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case '0':
        return {{0, 0}};
      case 'x': {
        const uint32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        const uint32_t v = hex(4);
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        --i_;
        fail("a word boundary (\\b)");
      case 'B':
        --i_;
        fail("a word boundary (\\B)");
      default:
        break;
    }
    if (c >= '1' && c <= '9') {
      --i_;
      fail("a backreference");
    }
    if (std::isalnum(static_cast<unsigned char>(c))) {
      --i_;
      fail(cat("an unknown escape \\", c));
    }
    --i_;
    const uint32_t cp = code_point();
    return {{cp, cp}};
  }

  Rx klass() {  // after '['
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++i_;
    }
    CpRanges set;
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) fail("an unterminated character class");
      if (peek(']') && !first) {
        ++i_;
        break;
      }
      first = false;
      CpRanges item;
      if (peek('[') && i_ + 1 < p_.size() && p_[i_ + 1] == ':') fail("a POSIX class [:...:]");
      if (peek('\\')) {
        ++i_;
        item = escape(true);
      } else {
        const uint32_t cp = code_point();
        item = {{cp, cp}};
      }
      // A range a-z (a '-' before ']' is a literal).
      if (item.size() == 1 && item[0].first == item[0].second && peek('-') && i_ + 1 < p_.size() &&
          p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi;
        if (peek('\\')) {
          ++i_;
          const CpRanges e = escape(true);
          if (e.size() != 1 || e[0].first != e[0].second) fail("a class as a range's end");
          hi = e[0].first;
        } else {
          hi = code_point();
        }
        if (hi < item[0].first) fail("a range with its ends reversed");
        item[0].second = hi;
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    return enc_(negate ? cp_negate(set) : cp_normalize(set));
  }

  Rx atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (peek('?')) {
        ++i_;
        if (peek(':')) {
          ++i_;
        } else if (peek('P') ||
                   (peek('<') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!')) {
          if (peek('P')) ++i_;
          if (!peek('<')) fail("an unsupported group (?P");
          while (i_ < p_.size() && p_[i_] != '>') ++i_;
          if (!peek('>')) fail("an unterminated group name");
          ++i_;
        } else {
          fail("lookaround or an inline flag group (?...)");
        }
      }
      Rx inner = alternation();
      if (!peek(')')) fail("a missing ')'");
      ++i_;
      return inner;
    }
    if (c == '[') {
      ++i_;
      return klass();
    }
    if (c == '.') {
      ++i_;
      // ECMAScript's (JSON Schema's) dot: any character but a line terminator.
      return enc_(cp_negate({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') {
      ++i_;
      return enc_(escape(false));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("a quantifier with nothing before it");
    if (c == '^' || c == '$') fail("'^' or '$' inside the pattern");
    const uint32_t cp = code_point();
    return enc_({{cp, cp}});
  }

  std::string_view p_;
  const CharEncoder& enc_;
  size_t i_ = 0;
};

}  // namespace

ParsedRegex parse_regex(std::string_view pattern, const CharEncoder& encode) {
  return Parser(pattern, encode).parse();
}

}  // namespace loom::infer::constrain
