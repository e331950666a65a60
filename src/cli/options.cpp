#include "cli/options.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace loom::cli {

Options& Options::value(const std::string& name, const std::string& def, const std::string& help,
                        bool required) {
  opts_.push_back({name, def, help, Opt::Value, required});
  return *this;
}
Options& Options::flag(const std::string& name, const std::string& help) {
  opts_.push_back({name, "", help, Opt::Flag, false});
  return *this;
}
Options& Options::multi(const std::string& name, const std::string& help) {
  opts_.push_back({name, "", help, Opt::Multi, false});
  return *this;
}
Options& Options::values(const std::string& name, const std::string& help) {
  opts_.push_back({name, "", help, Opt::Many, false});
  return *this;
}
Options& Options::positional(const std::string& name, const std::string& help, bool required) {
  opts_.push_back({name, "", help, Opt::Positional, required});
  return *this;
}

const Options::Opt* Options::find(const std::string& name) const {
  for (auto& o : opts_)
    if (o.name == name) return &o;
  return nullptr;
}

bool Options::parse(const Args& args) {
  size_t next_pos = 0;
  std::vector<const Opt*> positionals;
  for (auto& o : opts_)
    if (o.kind == Opt::Positional) positionals.push_back(&o);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      std::string name = a.substr(2), val;
      bool inline_val = false;
      if (size_t eq = name.find('='); eq != std::string::npos) {
        val = name.substr(eq + 1);
        name = name.substr(0, eq);
        inline_val = true;
      }
      const Opt* o = find(name);
      LOOM_CHECK(o && o->kind != Opt::Positional, "unknown option '--", name, "' (see --help)");
      if (o->kind == Opt::Flag) {
        LOOM_CHECK(!inline_val, "option --", name, " takes no value");
        values_[name] = "true";
        continue;
      }
      if (o->kind == Opt::Many) {
        std::vector<std::string>& vs = multi_[name];
        if (inline_val) vs.push_back(val);
        while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) vs.push_back(args[++i]);
        LOOM_CHECK(!vs.empty(), "option --", name, " needs a value");
        values_[name] = vs.front();
        continue;
      }
      if (!inline_val) {
        LOOM_CHECK(i + 1 < args.size(), "option --", name, " needs a value");
        val = args[++i];
      }
      if (o->kind == Opt::Multi)
        multi_[name].push_back(val);
      else
        values_[name] = val;
      continue;
    }
    LOOM_CHECK(next_pos < positionals.size(), "unexpected argument '", a, "' (see --help)");
    values_[positionals[next_pos++]->name] = a;
  }
  for (auto& o : opts_)
    LOOM_CHECK(!o.required || values_.count(o.name),
               o.kind == Opt::Positional ? cat("missing argument <", o.name, ">")
                                         : cat("missing required option --", o.name),
               " (see --help)");
  return true;
}

std::string Options::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  const Opt* o = find(name);
  LOOM_CHECK(o, "internal: option '", name, "' not declared");
  return o->def;
}

int64_t Options::get_int(const std::string& name, int64_t lo, int64_t hi) const {
  std::string s = get(name);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  LOOM_CHECK(!s.empty() && *end == 0, "--", name, " must be an integer, got '", s, "'");
  LOOM_CHECK(errno != ERANGE && v >= lo && v <= hi, "--", name, " = ", s, " is out of range [", lo,
             ", ", hi, "]");
  return v;
}

double Options::get_double(const std::string& name) const {
  std::string s = get(name);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  LOOM_CHECK(!s.empty() && *end == 0, "--", name, " must be a number, got '", s, "'");
  LOOM_CHECK(std::isfinite(v), "--", name, " = ", s, " is not a finite number");
  return v;
}

bool Options::has(const std::string& name) const {
  return values_.count(name) > 0;
}

const std::vector<std::string>& Options::all(const std::string& name) const {
  static const std::vector<std::string> none;
  auto it = multi_.find(name);
  return it == multi_.end() ? none : it->second;
}

std::string Options::help() const {
  std::string h = "usage: " + usage_ + "\n\n" + description_ + "\n";
  bool any_pos = false;
  for (auto& o : opts_) {
    if (o.kind != Opt::Positional) continue;
    if (!any_pos) h += "\narguments:\n";
    any_pos = true;
    char buf[512];
    std::snprintf(buf, sizeof buf, "  %-24s %s%s\n", ("<" + o.name + ">").c_str(), o.help.c_str(),
                  o.required ? "" : " (optional)");
    h += buf;
  }
  h += "\noptions:\n";
  for (auto& o : opts_) {
    if (o.kind == Opt::Positional) continue;
    std::string lhs = "--" + o.name +
                      (o.kind == Opt::Flag   ? ""
                       : o.kind == Opt::Many ? " V..."
                                             : " V");
    std::string rhs = o.help;
    if (o.kind == Opt::Value && !o.def.empty()) rhs += " [default: " + o.def + "]";
    if (o.required) rhs += " (required)";
    if (o.kind == Opt::Multi) rhs += " (repeatable)";
    char buf[1024];
    std::snprintf(buf, sizeof buf, "  %-24s %s\n", lhs.c_str(), rhs.c_str());
    h += buf;
  }
  h += "  --help                   show this help\n";
  return h;
}

}  // namespace loom::cli
