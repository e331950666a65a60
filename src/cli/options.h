// Declarative option parsing for subcommands, so `--help` is generated from the same table
// the parser uses and cannot drift from what is accepted.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli/command.h"

namespace loom::cli {

// The most threads or workers a flag may ask for: more cannot be started on any machine Loom
// runs on (100,000 was an "internal error: Resource temporarily unavailable").
constexpr int kMaxThreads = 4096;

class Options {
 public:
  Options(std::string usage, std::string description)
      : usage_(std::move(usage)), description_(std::move(description)) {}

  // --name VALUE (default shown in help; empty default means "required" only if required=true).
  Options& value(const std::string& name, const std::string& def, const std::string& help,
                 bool required = false);
  // --name (boolean flag).
  Options& flag(const std::string& name, const std::string& help);
  // --name VALUE that may repeat (e.g. --set a.b=1 --set c.d=2).
  Options& multi(const std::string& name, const std::string& help);
  // --name V1 [V2 ...]: every following argument up to the next option (all() returns them).
  Options& values(const std::string& name, const std::string& help);
  // Named positional arguments, in order; trailing ones may be optional.
  Options& positional(const std::string& name, const std::string& help, bool required = true);

  // Returns false if --help was given (help already printed). Throws loom::Error on bad usage.
  bool parse(const Args& args);

  std::string get(const std::string& name) const;
  // Integers are range-checked: out of [lo, hi] (or of int64) is an error naming the option
  // and the value, never a silent wrap when the caller narrows.
  int64_t get_int(const std::string& name, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const;
  int get_int32(const std::string& name, int lo = INT32_MIN, int hi = INT32_MAX) const {
    return static_cast<int>(get_int(name, lo, hi));
  }
  double get_double(const std::string& name) const;  // finite numbers only
  bool has(const std::string& name) const;           // flag given, or value given explicitly
  const std::vector<std::string>& all(const std::string& name) const;
  std::string help() const;

 private:
  struct Opt {
    std::string name, def, help;
    enum Kind { Value, Flag, Multi, Many, Positional } kind;
    bool required = false;
  };
  const Opt* find(const std::string& name) const;
  std::string usage_, description_;
  std::vector<Opt> opts_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> multi_;
};

// The help of an option that names a tokenizer (the specs data::load_tokenizer reads).
inline constexpr const char* kTokenizerSpecHelp =
    "gpt2:DIR | tiktoken:FILE | loom:DIR | hf:PATH (tokenizer.json) | spm:PATH (tokenizer.model), "
    "or a path (kind detected)";

}  // namespace loom::cli
