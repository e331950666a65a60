// Configuration: TOML (parsed by toml++) flattened to dotted keys ("[optim] lr = 3e-4" and
// "optim = { lr = 3e-4 }" both give "optim.lr"), plus command-line overrides "section.key=value".
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
  // Full TOML; a syntax error is a loom::Error naming `where`, the line and the column.
  static Config parse(const std::string& text, const std::string& where);
  // Fails (naming the path) when the path is missing, a directory or unreadable.
  static Config load(const std::string& path);

  // "a.b=value" from the command line (or any other source named by `where`). The value is read
  // as a TOML value when it is one (6, 3e-4, true, "text", [1, 2]); anything else is taken as a
  // bare string (a path, a preset name), so --set data.paths=/tmp/x needs no quotes.
  void set_override(const std::string& assignment, const std::string& where = "command line");
  void set(const std::string& key, const std::string& value, const std::string& where);

  bool has(const std::string& key) const { return values_.count(key) > 0; }
  // Strings as they are; numbers and booleans as their text; an array as its TOML text
  // (["a", "b"], which is also JSON for a list of strings: curate's list settings read it so).
  std::string get_string(const std::string& key, const std::string& def) const;
  // Each of these fails, naming the key and where it was set, when the value has another type
  // or does not fit (1e30 for an integer, a non-finite number).
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  // As above, and a value outside [lo, hi] fails naming the key, the bounds and where it was
  // set (the default is not checked: it is the caller's to choose).
  int64_t get_int(const std::string& key, int64_t def, int64_t lo, int64_t hi) const;
  double get_double(const std::string& key, double def, double lo, double hi) const;
  // Where a key was set ("run.toml:12", "--set"), for a caller's own range errors; "" if unset.
  std::string where(const std::string& key) const;
  // An array of scalars gives its elements' text; a string is split at commas (the older
  // "a,b,c" spelling, kept so existing configs and --set overrides still work).
  std::vector<std::string> get_string_list(const std::string& key,
                                           const std::vector<std::string>& def) const;

  // Throws for the first key never read, listing the keys that are valid under its section.
  void check_all_used() const;
  std::vector<std::string> keys() const;
  // Back to TOML text (one "dotted.key = value" line per key, sorted) that parse() reads back
  // to the same values.
  std::string dump() const;

  // One value in its stored form (public only so the toml++ conversion in config.cpp can fill
  // it; callers use the get_* functions).
  enum class Kind { String, Integer, Float, Bool, Array };
  struct Entry {
    Kind kind = Kind::String;
    std::string text;          // the string, or a number's / boolean's TOML text
    std::vector<Entry> items;  // Kind::Array
    int64_t int_value = 0;     // Kind::Integer
    double float_value = 0;    // Kind::Float
    bool bool_value = false;   // Kind::Bool
    std::string where;
  };

 private:
  const Entry* find(const std::string& key) const;
  static std::string toml_text(const Entry& e);
  std::map<std::string, Entry> values_;
  mutable std::set<std::string> used_;
};

}  // namespace loom
