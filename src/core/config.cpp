#include "core/config.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"

namespace loom {

static std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

static bool valid_key(const std::string& k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

Config Config::parse(const std::string& text, const std::string& where) {
  Config cfg;
  std::istringstream in(text);
  std::string line, section;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string loc = cat(where, ":", lineno);
    // Strip comments that are not inside a quoted string.
    bool in_str = false;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '"') in_str = !in_str;
      if (line[i] == '#' && !in_str) {
        line.resize(i);
        break;
      }
    }
    line = trim(line);
    if (line.empty()) continue;
    if (line.front() == '[') {
      LOOM_CHECK(line.back() == ']', loc, ": unterminated section header");
      section = trim(line.substr(1, line.size() - 2));
      LOOM_CHECK(valid_key(section), loc, ": invalid section name '", section, "'");
      continue;
    }
    size_t eq = line.find('=');
    LOOM_CHECK(eq != std::string::npos, loc, ": expected 'key = value'");
    std::string key = trim(line.substr(0, eq));
    LOOM_CHECK(valid_key(key), loc, ": invalid key '", key, "'");
    if (!section.empty()) key = section + "." + key;
    LOOM_CHECK(!cfg.has(key), loc, ": key '", key, "' set twice");
    cfg.set(key, trim(line.substr(eq + 1)), loc);
  }
  return cfg;
}

Config Config::load(const std::string& path) {
  return parse(read_file(path), path);
}

void Config::set_override(const std::string& assignment, const std::string& where) {
  size_t eq = assignment.find('=');
  LOOM_CHECK(eq != std::string::npos && eq > 0, where, ": override '", assignment,
             "' is not of the form section.key=value");
  std::string key = trim(assignment.substr(0, eq));
  LOOM_CHECK(valid_key(key), where, ": invalid key '", key, "'");
  set(key, trim(assignment.substr(eq + 1)), where);
}

void Config::set(const std::string& key, const std::string& raw, const std::string& where) {
  Entry e;
  e.where = where;
  if (raw.size() >= 2 && raw.front() == '"' && raw.back() == '"') {
    e.value = raw.substr(1, raw.size() - 2);
    e.quoted = true;
  } else {
    LOOM_CHECK(!raw.empty(), where, ": empty value for '", key, "'");
    e.value = raw;
  }
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
  return e ? e->value : def;
}

int64_t Config::get_int(const std::string& key, int64_t def) const {
  const Entry* e = find(key);
  if (!e) return def;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(e->value.c_str(), &end, 10);
  LOOM_CHECK(!e->quoted && errno == 0 && *end == 0 && !e->value.empty(), e->where, ": '", key,
             "' must be an integer, got '", e->value, "'");
  return v;
}

double Config::get_double(const std::string& key, double def) const {
  const Entry* e = find(key);
  if (!e) return def;
  char* end = nullptr;
  double v = std::strtod(e->value.c_str(), &end);
  LOOM_CHECK(!e->quoted && *end == 0 && !e->value.empty(), e->where, ": '", key,
             "' must be a number, got '", e->value, "'");
  return v;
}

bool Config::get_bool(const std::string& key, bool def) const {
  const Entry* e = find(key);
  if (!e) return def;
  if (e->value == "true") return true;
  if (e->value == "false") return false;
  fail(e->where, ": '", key, "' must be true or false, got '", e->value, "'");
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

std::string Config::dump() const {
  std::string out;
  for (auto& [k, e] : values_)
    out += k + " = " + (e.quoted ? "\"" + e.value + "\"" : e.value) + "\n";
  return out;
}

}  // namespace loom
