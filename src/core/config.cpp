#include "core/config.h"

// toml++ 3.3's parse_key asserts an invariant that an input such as "[}" breaks (found by
// fuzz_config; regression input tests/fuzz/corpus/config/regress-e365edc5adcace2f). Its release
// build reports that input as the syntax error it is; with assertions on (debug and fuzz
// builds) the assert would abort the process instead. Its asserts guard toml++'s own
// development, not our inputs: off here, so every build gives the error.
#define TOML_ASSERT(expr) static_assert(true)
#include <toml++/toml.h>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"

namespace loom {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// One segment of a flattened key: a dot inside a segment ("a.b" quoted in TOML) would make the
// flattened key ambiguous.
bool valid_segment(std::string_view k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

bool valid_key(const std::string& k) {
  size_t start = 0;
  for (;;) {
    size_t dot = k.find('.', start);
    if (!valid_segment(std::string_view(k).substr(start, dot - start))) return false;
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

// Shortest text that reads back to the same double, spelled as a TOML float.
std::string float_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
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
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string line_of(const std::string& where, const toml::node& n) {
  return cat(where, ":", n.source().begin.line);
}

Config::Entry scalar_entry(const toml::node& n, const std::string& key, const std::string& where) {
  Config::Entry e;
  e.where = where;
  if (auto* s = n.as_string()) {
    e.text = s->get();
  } else if (auto* i = n.as_integer()) {
    e.kind = Config::Kind::Integer;
    e.int_value = i->get();
    e.text = std::to_string(e.int_value);
  } else if (auto* f = n.as_floating_point()) {
    e.kind = Config::Kind::Float;
    e.float_value = f->get();
    e.text = float_text(e.float_value);
  } else if (auto* b = n.as_boolean()) {
    e.kind = Config::Kind::Bool;
    e.bool_value = b->get();
    e.text = e.bool_value ? "true" : "false";
  } else if (n.is_date() || n.is_time() || n.is_date_time()) {
    // No setting is a date today; keep it as its text rather than refuse valid TOML.
    std::ostringstream os;
    n.visit([&](auto&& v) {
      if constexpr (toml::is_date<decltype(v)> || toml::is_time<decltype(v)> ||
                    toml::is_date_time<decltype(v)>)
        os << v;
    });
    e.text = os.str();
  } else {
    fail(where, ": '", key, "': arrays of tables and nested arrays are not supported");
  }
  return e;
}

Config::Entry node_entry(const toml::node& n, const std::string& key, const std::string& where) {
  if (auto* a = n.as_array()) {
    Config::Entry e;
    e.kind = Config::Kind::Array;
    e.where = where;
    for (const toml::node& item : *a) e.items.push_back(scalar_entry(item, key, where));
    return e;
  }
  return scalar_entry(n, key, where);
}

// Tables (headers, dotted keys, inline tables) become dotted key prefixes.
void flatten(const toml::table& t, const std::string& prefix, const std::string& where,
             std::map<std::string, Config::Entry>& out) {
  for (auto&& [k, v] : t) {
    const std::string loc = line_of(where, v);
    LOOM_CHECK(valid_segment(k.str()), loc, ": invalid key '", k.str(),
               "' (letters, digits, '_' and '-' only)");
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (auto* sub = v.as_table()) {
      flatten(*sub, key, where, out);
    } else {
      out[key] = node_entry(v, key, loc);
    }
  }
}

std::string describe(const Config::Entry& e) {
  switch (e.kind) {
    case Config::Kind::String:
      return cat("the string '", e.text, "'");
    case Config::Kind::Integer:
      return cat("the integer ", e.text);
    case Config::Kind::Float:
      return cat("the number ", e.text);
    case Config::Kind::Bool:
      return cat("the boolean ", e.text);
    case Config::Kind::Array:
      return "an array";
  }
  return "?";
}

bool looks_like_integer(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i >= s.size()) return false;
  for (; i < s.size(); ++i)
    if (!isdigit(static_cast<unsigned char>(s[i])) && s[i] != '_') return false;
  return true;
}

}  // namespace

// toml++ 3.3 (Debian 12) reaches __builtin_unreachable (undefined behaviour: a crash at best)
// when its generated is_non_ascii_horizontal_whitespace is asked about code points in three
// ranges: its 1018-wide buckets 0, 11 and 63 above U+00A0 hold one whitespace character each and
// no switch case for the rest (found by fuzz_config; regression inputs regress-2f2fe94570b2fd71
// and regress-e432775fa8041a10). Where toml++ asks is not worth predicting: a config holding any
// of those code points is refused before toml++ sees it, naming line, column and code point.
// Everything else, ASCII and the rest of Unicode in strings and comments, is unaffected.
static bool hits_toml_unreachable(uint32_t c) {
  if (c <= 0xA0 || c >= 0xFEFF || c == 0x3000) return false;
  const uint32_t bucket = (c - 0xA0) / 0x3FA;
  return bucket == 0 || bucket == 11 || bucket == 63;
}

static void check_toml_safe(const std::string& t, const std::string& where) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < t.size();) {
    const unsigned char b = static_cast<unsigned char>(t[i]);
    uint32_t c = b;
    size_t len = 1;
    if (b >= 0xC0 && b < 0xE0 && i + 1 < t.size()) {
      c = (b & 0x1Fu) << 6 | (static_cast<unsigned char>(t[i + 1]) & 0x3Fu), len = 2;
    } else if (b >= 0xE0 && b < 0xF0 && i + 2 < t.size()) {
      c = (b & 0x0Fu) << 12 | (static_cast<unsigned char>(t[i + 1]) & 0x3Fu) << 6 |
          (static_cast<unsigned char>(t[i + 2]) & 0x3Fu),
      len = 3;
    }
    LOOM_CHECK(!hits_toml_unreachable(c), where, ":", line, ":", col, ": character U+", std::hex, c,
               std::dec, " is not supported in config files (Debian's toml++ 3.3 mishandles ",
               "it); use ASCII or a \\u escape in a string");
    if (b == '\n') ++line, col = 0;
    i += len;
    ++col;
  }
}

Config Config::parse(const std::string& text, const std::string& where) {
  check_toml_safe(text, where);
  toml::table doc;
  try {
    doc = toml::parse(text, where);
  } catch (const toml::parse_error& err) {
    const auto& at = err.source().begin;
    // The offending line names the key, which toml++'s description alone may not.
    std::string line;
    std::istringstream in(text);
    for (uint32_t i = 0; i < at.line && std::getline(in, line); ++i) {
    }
    fail(where, ":", at.line, ":", at.column, ": ", err.description(), " (in '", trim(line), "')");
  }
  Config cfg;
  flatten(doc, "", where, cfg.values_);
  return cfg;
}

Config Config::load(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  LOOM_CHECK(std::filesystem::exists(st), path, ": cannot open config file (no such file)");
  LOOM_CHECK(!std::filesystem::is_directory(st), path,
             ": cannot open config file (it is a directory)");
  return parse(read_file(path), path);
}

void Config::set_override(const std::string& assignment, const std::string& where) {
  size_t eq = assignment.find('=');
  LOOM_CHECK(eq != std::string::npos && eq > 0, where, ": override '", assignment,
             "' is not of the form section.key=value");
  set(trim(assignment.substr(0, eq)), assignment.substr(eq + 1), where);
}

void Config::set(const std::string& key, const std::string& raw, const std::string& where) {
  LOOM_CHECK(valid_key(key), where, ": invalid key '", key, "'");
  const std::string value = trim(raw);
  LOOM_CHECK(!value.empty(), where, ": empty value for '", key, "'");
  try {
    toml::table t = toml::parse("v = " + value, where);
    const toml::node* n = t.get("v");
    if (n && t.size() == 1) {
      for (auto it = values_.begin(); it != values_.end();)  // a table replaces its old keys
        it = (n->is_table() && it->first.rfind(key + ".", 0) == 0) ? values_.erase(it) : ++it;
      if (auto* sub = n->as_table()) {
        std::map<std::string, Entry> flat;
        flatten(*sub, key, where, flat);
        for (auto& [k, e] : flat) {
          e.where = where;
          values_[k] = e;
        }
      } else {
        values_[key] = node_entry(*n, key, where);
      }
      return;
    }
  } catch (const toml::parse_error& err) {
    // Something that opens like a TOML string, array or table must be one.
    LOOM_CHECK(value.find_first_of("\"'[{") != 0, where, ": '", key, "': bad value '", value,
               "': ", err.description());
  }
  Entry e;  // not TOML: a bare string such as a path or a preset name
  e.text = value;
  e.where = where;
  values_[key] = e;
}

const Config::Entry* Config::find(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return nullptr;
  used_.insert(key);
  return &it->second;
}

std::string Config::get_string(const std::string& key, const std::string& def) const {
  const Entry* e = find(key);
  if (!e) return def;
  return e->kind == Kind::Array ? toml_text(*e) : e->text;
}

int64_t Config::get_int(const std::string& key, int64_t def) const {
  const Entry* e = find(key);
  if (!e) return def;
  if (e->kind == Kind::Integer) return e->int_value;
  if (e->kind == Kind::String && looks_like_integer(e->text))
    fail(e->where, ": '", key, "' = ", e->text, " is out of range for a 64-bit integer");
  fail(e->where, ": '", key, "' must be an integer, got ", describe(*e));
}

double Config::get_double(const std::string& key, double def) const {
  const Entry* e = find(key);
  if (!e) return def;
  if (e->kind == Kind::Integer) return static_cast<double>(e->int_value);
  LOOM_CHECK(e->kind == Kind::Float, e->where, ": '", key, "' must be a number, got ",
             describe(*e));
  LOOM_CHECK(std::isfinite(e->float_value), e->where, ": '", key, "' must be a finite number, got ",
             e->text);
  return e->float_value;
}

int64_t Config::get_int(const std::string& key, int64_t def, int64_t lo, int64_t hi) const {
  const int64_t v = get_int(key, def);
  if (has(key))
    LOOM_CHECK(v >= lo && v <= hi, where(key), ": '", key, "' = ", v, " is out of range [", lo,
               ", ", hi, "]");
  return v;
}

double Config::get_double(const std::string& key, double def, double lo, double hi) const {
  const double v = get_double(key, def);
  if (has(key))
    LOOM_CHECK(v >= lo && v <= hi, where(key), ": '", key, "' = ", values_.at(key).text,
               " is out of range [", lo, ", ", hi, "]");
  return v;
}

std::string Config::where(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? std::string() : it->second.where;
}

bool Config::get_bool(const std::string& key, bool def) const {
  const Entry* e = find(key);
  if (!e) return def;
  LOOM_CHECK(e->kind == Kind::Bool, e->where, ": '", key, "' must be true or false, got ",
             describe(*e));
  return e->bool_value;
}

std::vector<std::string> Config::get_string_list(const std::string& key,
                                                 const std::vector<std::string>& def) const {
  const Entry* e = find(key);
  if (!e) return def;
  std::vector<std::string> out;
  if (e->kind == Kind::Array) {
    for (auto& item : e->items) out.push_back(item.text);
  } else if (e->kind == Kind::String) {
    std::istringstream in(e->text);
    for (std::string item; std::getline(in, item, ',');)
      if (!trim(item).empty()) out.push_back(trim(item));
  } else {
    out.push_back(e->text);
  }
  return out;
}

void Config::check_all_used() const {
  for (auto& [k, e] : values_) {
    if (used_.count(k)) continue;
    std::string section = k.substr(0, k.rfind('.') == std::string::npos ? 0 : k.rfind('.'));
    std::string valid;
    for (auto& u : used_)
      if (u.rfind(section, 0) == 0) valid += (valid.empty() ? "" : ", ") + u;
    fail(e.where, ": unknown config key '", k, "'",
         valid.empty() ? std::string() : cat(" (keys read in this section: ", valid, ")"));
  }
}

std::vector<std::string> Config::keys() const {
  std::vector<std::string> k;
  for (auto& [key, e] : values_) k.push_back(key);
  return k;
}

std::string Config::toml_text(const Entry& e) {
  if (e.kind == Kind::String) return quoted(e.text);
  if (e.kind != Kind::Array) return e.text;
  std::string out = "[";
  for (size_t i = 0; i < e.items.size(); ++i) out += (i ? ", " : "") + toml_text(e.items[i]);
  return out + "]";
}

std::string Config::dump() const {
  std::string out;
  for (auto& [k, e] : values_) out += k + " = " + toml_text(e) + "\n";
  return out;
}

}  // namespace loom
