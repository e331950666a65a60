#include "data/jinja/lexer.h"

#include <cctype>
#include <cstring>

#include "core/error.h"
#include "core/utf8.h"

namespace loom::data::jinja {
namespace {

// Python's \s for the ASCII range (Jinja strips with str.rstrip() and regex \s).
bool space(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return (u >= 0x09 && u <= 0x0D) || (u >= 0x1C && u <= 0x20);
}

int count_lines(const std::string& s, size_t a, size_t b) {
  int n = 0;
  for (size_t i = a; i < b; ++i) n += s[i] == '\n';
  return n;
}

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& opt, const std::string& where)
      : s_(std::move(src)), opt_(opt), where_(where) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) {
      size_t open = pos_;
      while ((open = s_.find('{', open)) != std::string::npos) {
        const char n = open + 1 < s_.size() ? s_[open + 1] : 0;
        if (n == '{' || n == '%' || n == '#') break;
        ++open;
      }
      if (open == std::string::npos) {
        text(s_.substr(pos_), count_lines(s_, pos_, s_.size()));
        break;
      }
      const char kind = s_[open + 1];
      const char sign = open + 2 < s_.size() ? s_[open + 2] : 0;
      std::string t = s_.substr(pos_, open - pos_);
      const int lines = count_lines(s_, pos_, open);
      if (sign == '-') {
        size_t e = t.size();
        while (e > 0 && space(t[e - 1])) --e;
        t.resize(e);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        const size_t nl = t.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < t.size()) {
          bool all_space = true;
          for (size_t i = l_pos; i < t.size(); ++i) all_space &= space(t[i]);
          if (all_space) t.resize(l_pos);
        }
      }
      text(t, lines);
      pos_ = open + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (kind == '#')
        comment();
      else if (kind == '%' && raw_begin())
        raw();
      else
        tag(kind == '{');
    }
    out_.push_back({Token::End, "", line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void error(const std::string& what, int line) const {
    fail(where_, ":", line, ": ", what);
  }

  void text(const std::string& t, int lines) {
    if (!t.empty()) out_.push_back({Token::Text, t, line_});
    line_ += lines;
  }

  // After a block or comment end: '-' strips all following whitespace, '+' nothing, else
  // trim_blocks drops one newline.
  void after_end(char sign, bool block) {
    const size_t start = pos_;
    if (sign == '-') {
      while (pos_ < s_.size() && space(s_[pos_])) ++pos_;
    } else if (sign != '+' && block && opt_.trim_blocks && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > start ? s_[pos_ - 1] == '\n' : false;
    line_ += count_lines(s_, start, pos_);
  }

  void comment() {
    const size_t end = s_.find("#}", pos_);
    if (end == std::string::npos) error("comment '{#' is never closed ('#}')", line_);
    char sign = end > pos_ ? s_[end - 1] : 0;
    if (sign != '-' && sign != '+') sign = 0;
    line_ += count_lines(s_, pos_, end);
    pos_ = end + 2;
    line_starting_ = false;
    after_end(sign, true);
  }

  bool raw_begin() {
    size_t p = pos_;
    while (p < s_.size() && space(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    const size_t word_end = p;
    while (p < s_.size() && space(s_[p])) ++p;
    if (p == word_end && p < s_.size() &&
        (std::isalnum(static_cast<unsigned char>(s_[p])) || s_[p] == '_'))
      return false;
    const bool strip = s_.compare(p, 3, "-%}") == 0;
    if (!strip && s_.compare(p, 2, "%}") != 0) return false;
    line_ += count_lines(s_, pos_, p);
    pos_ = p + (strip ? 3 : 2);
    if (strip) after_end('-', true);
    return true;
  }

  void raw() {
    const int start_line = line_;
    for (size_t p = pos_; (p = s_.find("{%", p)) != std::string::npos; p += 2) {
      size_t q = p + 2;
      const char sign = q < s_.size() && (s_[q] == '-' || s_[q] == '+') ? s_[q] : 0;
      if (sign) ++q;
      while (q < s_.size() && space(s_[q])) ++q;
      if (s_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < s_.size() && space(s_[q])) ++q;
      char end_sign = 0;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) end_sign = s_[q++];
      if (s_.compare(q, 2, "%}") != 0) continue;
      std::string t = s_.substr(pos_, p - pos_);
      if (sign == '-')
        while (!t.empty() && space(t.back())) t.pop_back();
      const int lines = count_lines(s_, pos_, q);
      if (!t.empty()) out_.push_back({Token::Text, t, line_});
      line_ += lines;
      pos_ = q + 2;
      after_end(end_sign, true);
      return;
    }
    error("'{% raw %}' is never closed ('{% endraw %}')", start_line);
  }

  void tag(bool var) {
    const int open_line = line_;
    out_.push_back({var ? Token::VarBegin : Token::BlockBegin, "", line_});
    std::vector<char> brackets;
    while (true) {
      while (pos_ < s_.size() && space(s_[pos_])) {
        line_ += s_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= s_.size())
        error(cat("tag opened here is never closed ('", var ? "}}" : "%}", "')"), open_line);
      if (brackets.empty()) {
        const char* close = var ? "}}" : "%}";
        char sign = 0;
        if ((s_[pos_] == '-' || (!var && s_[pos_] == '+')) && s_.compare(pos_ + 1, 2, close) == 0)
          sign = s_[pos_];
        if (sign || s_.compare(pos_, 2, close) == 0) {
          out_.push_back({var ? Token::VarEnd : Token::BlockEnd, "", line_});
          pos_ += sign ? 3 : 2;
          line_starting_ = false;
          after_end(sign, !var);
          return;
        }
      }
      const char c = s_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
          ++e;
        out_.push_back({Token::Name, s_.substr(pos_, e - pos_), line_});
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        string(c);
      } else {
        op(brackets);
      }
    }
  }

  void number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
        ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      ++e;
      digits();
      is_float = true;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t f = e + 1;
      if (f < s_.size() && (s_[f] == '+' || s_[f] == '-')) ++f;
      if (f < s_.size() && std::isdigit(static_cast<unsigned char>(s_[f]))) {
        e = f;
        digits();
        is_float = true;
      }
    }
    std::string lit;
    for (size_t i = pos_; i < e; ++i)
      if (s_[i] != '_') lit += s_[i];
    Token t{is_float ? Token::Float : Token::Int, lit, line_};
    try {
      if (is_float)
        t.d = std::stod(lit);
      else
        t.i = std::stoll(lit);
    } catch (const std::exception&) {
      error(cat("number literal '", lit, "' is out of range"), line_);
    }
    out_.push_back(t);
    pos_ = e;
  }

  // Python's escapes, as Jinja unescapes string literals; an unknown escape stays as written.
  void string(char q) {
    const int start_line = line_;
    std::string v;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= s_.size()) error("string literal is never closed", start_line);
      const char c = s_[p];
      if (c == q) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        v += c;
        ++p;
        continue;
      }
      if (p + 1 >= s_.size()) error("string literal is never closed", start_line);
      const char e = s_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          v += '\n';
          break;
        case 't':
          v += '\t';
          break;
        case 'r':
          v += '\r';
          break;
        case '0':
          v += '\0';
          break;
        case 'a':
          v += '\a';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'v':
          v += '\v';
          break;
        case '\\':
          v += '\\';
          break;
        case '\'':
          v += '\'';
          break;
        case '"':
          v += '"';
          break;
        case '\n':
          ++line_;
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = p + k < s_.size() ? s_[p + k] : 0;
            if (!std::isxdigit(static_cast<unsigned char>(h)))
              error(cat("string literal has a truncated \\", e, " escape"), line_);
            cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h))
                                        ? h - '0'
                                        : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            error(cat("string literal escapes an invalid code point"), line_);
          utf8_append(v, cp);
          p += n;
          break;
        }
        default:
          v += '\\';
          v += e;
      }
    }
    out_.push_back({Token::String, v, start_line});
    pos_ = p + 1;
  }

  void op(std::vector<char>& brackets) {
    static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* t : two)
      if (s_.compare(pos_, 2, t) == 0) {
        out_.push_back({Token::Op, t, line_});
        pos_ += 2;
        return;
      }
    const char c = s_[pos_];
    if (!std::strchr("+-*/%~()[]{},.:|=<>!;", c))
      error(cat("unexpected character '", c, "' inside a tag"), line_);
    if (c == '(' || c == '[' || c == '{') brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty() || brackets.back() != c) error(cat("unexpected '", c, "'"), line_);
      brackets.pop_back();
    }
    out_.push_back({Token::Op, std::string(1, c), line_});
    ++pos_;
  }

  std::string s_;
  LexOptions opt_;
  const std::string& where_;
  std::vector<Token> out_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const LexOptions& opt, const std::string& where) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return Lexer(std::move(s), opt, where).run();
}

}  // namespace loom::data::jinja
