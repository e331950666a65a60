#include "core/json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/swar.h"
#include "core/utf8.h"

namespace loom {

static const char* type_name(Json::Type t) {
  static const char* n[] = {"null", "bool", "integer", "number", "string", "array", "object"};
  return n[static_cast<int>(t)];
}

bool Json::as_bool() const {
  LOOM_CHECK(type_ == Type::Bool, "expected bool, got ", type_name(type_));
  return i_ != 0;
}
int64_t Json::as_int() const {
  if (type_ == Type::Float) {
    // A float converts only when it is finite, whole and inside int64's range: casting any
    // other double to an integer is undefined behaviour.
    LOOM_CHECK(std::isfinite(d_) && std::floor(d_) == d_ && d_ >= -0x1p63 && d_ < 0x1p63,
               "expected integer, got ", dump());
    return static_cast<int64_t>(d_);
  }
  LOOM_CHECK(type_ == Type::Int, "expected integer, got ", type_name(type_));
  return i_;
}
int64_t Json::as_int(int64_t lo, int64_t hi) const {
  int64_t v = as_int();
  LOOM_CHECK(v >= lo && v <= hi, "integer ", v, " out of range [", lo, ", ", hi, "]");
  return v;
}
int32_t Json::as_int32() const {
  return static_cast<int32_t>(as_int(INT32_MIN, INT32_MAX));
}
double Json::as_double() const {
  if (type_ == Type::Int) return static_cast<double>(i_);
  LOOM_CHECK(type_ == Type::Float, "expected number, got ", type_name(type_));
  return d_;
}
const std::string& Json::as_string() const {
  LOOM_CHECK(type_ == Type::String, "expected string, got ", type_name(type_));
  return s_;
}
const Json::Array& Json::as_array() const {
  LOOM_CHECK(type_ == Type::Array, "expected array, got ", type_name(type_));
  return *a_;
}
Json::Array& Json::as_array() {
  LOOM_CHECK(type_ == Type::Array, "expected array, got ", type_name(type_));
  return *a_;
}
const Json::Object& Json::as_object() const {
  LOOM_CHECK(type_ == Type::Object, "expected object, got ", type_name(type_));
  return *o_;
}
Json::Object& Json::as_object() {
  LOOM_CHECK(type_ == Type::Object, "expected object, got ", type_name(type_));
  return *o_;
}
bool Json::contains(const std::string& key) const {
  return type_ == Type::Object && o_->count(key) > 0;
}
const Json& Json::at(const std::string& key) const {
  auto& o = as_object();
  auto it = o.find(key);
  LOOM_CHECK(it != o.end(), "missing field '", key, "'");
  return it->second;
}
Json& Json::operator[](const std::string& key) {
  if (type_ == Type::Null) *this = object();
  return as_object()[key];
}
void Json::push_back(Json v) {
  if (type_ == Type::Null) *this = array();
  as_array().push_back(std::move(v));
}
size_t Json::size() const {
  if (type_ == Type::Array) return a_->size();
  if (type_ == Type::Object) return o_->size();
  return 0;
}

namespace {

// Bytes that a JSON string cannot hold as they are: '"', '\\' and the C0 controls. Both the
// writer and the parser copy the runs between them in bulk, found eight bytes at a time.

// Index of the first byte at or after i that is '"', '\\' or a control character (s.size()
// if none).
size_t next_special(std::string_view s, size_t i) {
  const size_t n = s.size();
  for (; i + 8 <= n; i += 8) {
    uint64_t w = swar::load8(s.data() + i);
    uint64_t special = swar::equal(w, '"') | swar::equal(w, '\\') | swar::below(w, 0x20);
    if (special) return i + swar::first(special);
  }
  for (; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\' || c < 0x20) return i;
  }
  return n;
}

// \uXXXX in lowercase hex, as Python's json module writes it.
void append_u_escape(std::string& out, uint32_t unit) {
  static const char hex[] = "0123456789abcdef";
  const char u[6] = {
      '\\',          'u', hex[(unit >> 12) & 15], hex[(unit >> 8) & 15], hex[(unit >> 4) & 15],
      hex[unit & 15]};
  out.append(u, 6);
}

void append_escape(std::string& out, unsigned char c) {
  switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    default:  // the other controls (and DEL in ASCII output) as \u00xx
      append_u_escape(out, c);
  }
}

// The writer's scan: the parser's specials and every byte >= 0x80 (checked as UTF-8); with
// `del`, 0x7F too (escaped when the output must be ASCII).
size_t next_special_or_high(std::string_view s, size_t i, bool del) {
  const size_t n = s.size();
  const uint64_t del_mask = del ? ~uint64_t(0) : 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = swar::load8(s.data() + i);
    uint64_t special = swar::equal(w, '"') | swar::equal(w, '\\') | swar::below(w, 0x20) |
                       (w & swar::kHigh) | (swar::equal(w, 0x7F) & del_mask);
    if (special) return i + swar::first(special);
  }
  for (; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80 || (del && c == 0x7F)) return i;
  }
  return n;
}

// A code point as ASCII: one escape, or a UTF-16 surrogate pair above U+FFFF.
void append_ascii_code_point(std::string& out, uint32_t cp) {
  if (cp >= 0x10000) {
    append_u_escape(out, 0xD800 + ((cp - 0x10000) >> 10));
    append_u_escape(out, 0xDC00 + ((cp - 0x10000) & 0x3FF));
  } else {
    append_u_escape(out, cp);
  }
}

// The code point of a well-formed UTF-8 sequence of `len` bytes (utf8_char checked it).
uint32_t decode_checked(const char* p, size_t len) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(p[k]); };
  if (len == 2) return (uint32_t(b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (len == 3) return (uint32_t(b(0) & 0x0F) << 12) | (uint32_t(b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return (uint32_t(b(0) & 0x07) << 18) | (uint32_t(b(1) & 0x3F) << 12) |
         (uint32_t(b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

}  // namespace

// Output that claims to be JSON is valid UTF-8 whatever the bytes given: an ill-formed
// sequence (a token that ends inside a character, bytes of another encoding) is written as
// U+FFFD, one per maximal ill-formed prefix, as Hugging Face's and vLLM's detokenisers do.
void json_escape(std::string& out, std::string_view s, bool ensure_ascii) {
  out.reserve(out.size() + s.size() + 2);
  out += '"';
  size_t i = 0;
  for (;;) {
    size_t j = next_special_or_high(s, i, ensure_ascii);
    out.append(s.data() + i, j - i);
    if (j == s.size()) break;
    if (static_cast<unsigned char>(s[j]) < 0x80) {
      append_escape(out, static_cast<unsigned char>(s[j]));
      i = j + 1;
      continue;
    }
    size_t bad;
    bool truncated;
    if (const size_t len = utf8_char(s, j, bad, truncated)) {
      if (ensure_ascii)
        append_ascii_code_point(out, decode_checked(s.data() + j, len));
      else
        out.append(s.data() + j, len);
      i = j + len;
    } else {
      if (ensure_ascii)
        append_u_escape(out, 0xFFFD);
      else
        out += kUtf8Replacement;
      i = j + bad;
    }
  }
  out += '"';
}

void Json::dump_to(std::string& out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent <= 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (type_) {
    case Type::Null:
      out += "null";
      break;
    case Type::Bool:
      out += i_ ? "true" : "false";
      break;
    case Type::Int:
      out += std::to_string(i_);
      break;
    case Type::Float: {
      if (!std::isfinite(d_)) {  // JSON has no inf/nan; write null rather than invalid JSON
        out += "null";
        break;
      }
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", d_);
      out += buf;
      break;
    }
    case Type::String:
      json_escape(out, s_);
      break;
    case Type::Array: {
      out += '[';
      for (size_t i = 0; i < a_->size(); ++i) {
        if (i) out += indent > 0 ? "," : ", ";
        newline(depth + 1);
        (*a_)[i].dump_to(out, indent, depth + 1);
      }
      if (!a_->empty()) newline(depth);
      out += ']';
      break;
    }
    case Type::Object: {
      out += '{';
      bool first = true;
      for (auto& [k, v] : *o_) {
        if (!first) out += indent > 0 ? "," : ", ";
        first = false;
        newline(depth + 1);
        json_escape(out, k);
        out += ": ";
        v.dump_to(out, indent, depth + 1);
      }
      if (!o_->empty()) newline(depth);
      out += '}';
      break;
    }
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

namespace {
class Parser {
 public:
  Parser(std::string_view t, const std::string& where) : t_(t), where_(where) {}

  Json document() {
    Json v = value(0);
    ws();
    if (p_ != t_.size()) error("trailing characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail(where_, ":", line, ":", col, ": ", what);
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\r' || t_[p_] == '\t'))
      ++p_;
  }
  bool lit(std::string_view s) {
    if (t_.substr(p_, s.size()) == s) {
      p_ += s.size();
      return true;
    }
    return false;
  }
  Json value(int depth) {
    if (depth >= 512) error("nesting deeper than 512 levels (too_deep)");  // depth counts from 0
    ws();
    if (p_ >= t_.size()) error("unexpected end of input");
    char c = t_[p_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Json(string());
    if (lit("true")) return Json(true);
    if (lit("false")) return Json(false);
    if (lit("null")) return Json();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    error(cat("unexpected character '", c, "'"));
  }
  Json object(int depth) {
    ++p_;
    Json::Object o;
    ws();
    if (p_ < t_.size() && t_[p_] == '}') {
      ++p_;
      return Json(std::move(o));
    }
    for (;;) {
      ws();
      if (p_ >= t_.size() || t_[p_] != '"') error("expected a string key");
      std::string k = string();
      ws();
      if (p_ >= t_.size() || t_[p_] != ':') error("expected ':' after key");
      ++p_;
      o.insert_or_assign(std::move(k), value(depth + 1));
      ws();
      if (p_ < t_.size() && t_[p_] == ',') {
        ++p_;
        continue;
      }
      if (p_ < t_.size() && t_[p_] == '}') {
        ++p_;
        return Json(std::move(o));
      }
      error("expected ',' or '}' in object");
    }
  }
  Json array(int depth) {
    ++p_;
    Json::Array a;
    ws();
    if (p_ < t_.size() && t_[p_] == ']') {
      ++p_;
      return Json(std::move(a));
    }
    for (;;) {
      a.push_back(value(depth + 1));
      ws();
      if (p_ < t_.size() && t_[p_] == ',') {
        ++p_;
        continue;
      }
      if (p_ < t_.size() && t_[p_] == ']') {
        ++p_;
        return Json(std::move(a));
      }
      error("expected ',' or ']' in array");
    }
  }
  uint32_t hex4() {
    if (p_ + 4 > t_.size()) error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[p_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        error("bad hex digit in \\u escape");
    }
    return v;
  }
  std::string string() {
    ++p_;  // opening quote
    std::string s;
    for (;;) {
      size_t plain_end = next_special(t_, p_);
      s.append(t_.data() + p_, plain_end - p_);
      p_ = plain_end;
      if (p_ >= t_.size()) error("unterminated string");
      char c = t_[p_++];
      if (c == '"') return s;
      if (static_cast<unsigned char>(c) < 0x20) error("control character inside a string");
      // c is a backslash
      if (p_ >= t_.size()) error("unterminated escape");
      char e = t_[p_++];
      switch (e) {
        case '"':
          s += '"';
          break;
        case '\\':
          s += '\\';
          break;
        case '/':
          s += '/';
          break;
        case 'b':
          s += '\b';
          break;
        case 'f':
          s += '\f';
          break;
        case 'n':
          s += '\n';
          break;
        case 'r':
          s += '\r';
          break;
        case 't':
          s += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // surrogate pair
            if (p_ + 6 <= t_.size() && t_[p_] == '\\' && t_[p_ + 1] == 'u') {
              p_ += 2;
              uint32_t lo = hex4();
              if (lo < 0xDC00 || lo >= 0xE000) error("invalid low surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              cp = 0xFFFD;  // lone high surrogate: replacement character
            }
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            cp = 0xFFFD;
          }
          utf8_append(s, cp);
          break;
        }
        default:
          error(cat("invalid escape '\\", e, "'"));
      }
    }
  }
  Json number() {
    size_t start = p_;
    bool is_float = false;
    if (t_[p_] == '-') ++p_;
    if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) error("invalid number");
    while (p_ < t_.size()) {
      char c = t_[p_];
      if (c >= '0' && c <= '9') {
        ++p_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || (c == '-' && p_ > start)) {
        is_float = true;
        ++p_;
      } else {
        break;
      }
    }
    std::string num(t_.substr(start, p_ - start));
    char* end = nullptr;
    if (!is_float) {
      errno = 0;
      long long v = std::strtoll(num.c_str(), &end, 10);
      if (errno == 0 && *end == 0) return Json(static_cast<int64_t>(v));
    }
    errno = 0;
    double d = std::strtod(num.c_str(), &end);
    if (*end != 0) error(cat("invalid number '", num, "'"));
    // Overflow gives +-inf, which JSON cannot hold and no reader expects.
    if (!std::isfinite(d)) error(cat("number '", num, "' out of range"));
    return Json(d);
  }

  std::string_view t_;
  const std::string& where_;
  size_t p_ = 0;
};
}  // namespace

Json Json::parse(std::string_view text, const std::string& where) {
  return Parser(text, where).document();
}

}  // namespace loom
