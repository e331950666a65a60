// Configuration: a TOML subset ([section] headers, key = value with strings, numbers, booleans,
// comments) flattened to dotted keys, plus command-line overrides "section.key=value".
// Every key that is set must be read by someone: check_all_used() turns a misspelt key into a
// clear error naming the key and where it was set, instead of a silently ignored setting.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace loom {

class Config {
 public:
  static Config parse(const std::string& text, const std::string& where);
  static Config load(const std::string& path);

  // "a.b=value" from the command line (or any other source named by `where`).
  void set_override(const std::string& assignment, const std::string& where = "command line");
  void set(const std::string& key, const std::string& value, const std::string& where);

  bool has(const std::string& key) const { return values_.count(key) > 0; }
  std::string get_string(const std::string& key, const std::string& def) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;

  // Throws for the first key never read, listing the keys that are valid under its section.
  void check_all_used() const;
  std::vector<std::string> keys() const;
  std::string dump() const;  // back to TOML-subset text, sorted by key

 private:
  struct Entry {
    std::string value;  // unquoted text
    bool quoted = false;
    std::string where;
  };
  const Entry* find(const std::string& key) const;
  std::map<std::string, Entry> values_;
  mutable std::set<std::string> used_;
};

}  // namespace loom
