#include "data/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/error.h"

namespace loom::data::jinja {
namespace {

// Results past this many bytes or items are refused: a template that grows without bound is
// a bug or an attack, not a chat format.
constexpr size_t kMaxSize = size_t(64) << 20;

std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}

std::string upper_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  return s;
}

bool is_alpha(uint32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

const std::string& need_string(const Value& v, const std::string& what) {
  if (!v.is_string()) fail(what, " expects a string, got ", v.type_name());
  return v.as_string();
}

int64_t need_int(const Value& v, const std::string& what) {
  if (!v.is_int() && !v.is_bool()) fail(what, " expects an integer, got ", v.type_name());
  return v.as_int();
}

// str.strip/lstrip/rstrip: Python whitespace, or any code point of `chars`.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::vector<uint32_t> cps = code_points(s);
  std::vector<uint32_t> set;
  const bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) set = code_points(need_string(chars, "strip"));
  auto drop = [&](uint32_t c) {
    return ws ? python_isspace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) ++b;
  if (right)
    while (e > b && drop(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

List split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is_undefined() || sep.is_none()) {
    const std::vector<uint32_t> cps = code_points(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && python_isspace(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        out.emplace_back(from_code_points(cps, i, cps.size()));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !python_isspace(cps[j])) ++j;
      out.emplace_back(from_code_points(cps, i, j));
      i = j;
    }
    return out;
  }
  const std::string& d = need_string(sep, "split");
  if (d.empty()) fail("split: empty separator");
  size_t start = 0;
  while (true) {
    const size_t p = s.find(d, start);
    if (p == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) break;
    out.emplace_back(s.substr(start, p - start));
    start = p + d.size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count) {
  std::string out;
  int64_t n = 0;
  if (old.empty()) {
    const std::vector<uint32_t> cps = code_points(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < cps.size()) out += from_code_points(cps, i, i + 1);
      if (out.size() > kMaxSize) fail("replace: result too large");
    }
    return out;
  }
  size_t start = 0;
  while (true) {
    const size_t p = s.find(old, start);
    if (p == std::string::npos || (count >= 0 && n == count)) break;
    out.append(s, start, p - start);
    out += repl;
    if (out.size() > kMaxSize) fail("replace: result too large");
    start = p + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Python's str.title() on ASCII letters: upper after a non-letter, lower after a letter.
std::string title_words(const std::string& s) {
  std::string out = s;
  bool prev = false;
  for (char& c : out) {
    const bool alpha = is_alpha(static_cast<unsigned char>(c));
    if (alpha) c = prev ? lower_ascii(std::string(1, c))[0] : upper_ascii(std::string(1, c))[0];
    prev = alpha;
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = lower_ascii(s);
  if (!out.empty()) out[0] = upper_ascii(out.substr(0, 1))[0];
  return out;
}

bool starts_or_ends(const std::string& s, const Value& what, bool start, const char* name) {
  auto one = [&](const Value& p) {
    const std::string& x = need_string(p, name);
    if (x.size() > s.size()) return false;
    return start ? s.compare(0, x.size(), x) == 0
                 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (what.is_list()) {
    for (const Value& p : what.as_list())
      if (one(p)) return true;
    return false;
  }
  return one(what);
}

Value string_method(const std::string& s, const std::string& name, Args& a) {
  ArgReader r(a, "str." + name);
  Value out;
  if (name == "startswith" || name == "endswith") {
    out = Value(starts_or_ends(s, r.at(0, "prefix"), name == "startswith", name.c_str()));
  } else if (name == "strip" || name == "lstrip" || name == "rstrip") {
    out = Value(strip(s, r.at(0, "chars"), name != "rstrip", name != "lstrip"));
  } else if (name == "split") {
    const Value sep = r.at(0, "sep");
    out = Value(split(s, sep, need_int(r.at(1, "maxsplit", Value(-1)), "split")));
  } else if (name == "lower") {
    out = Value(lower_ascii(s));
  } else if (name == "upper") {
    out = Value(upper_ascii(s));
  } else if (name == "title") {
    out = Value(title_words(s));
  } else if (name == "capitalize") {
    out = Value(capitalize(s));
  } else if (name == "replace") {
    const std::string old = need_string(r.at(0, "old"), "replace");
    const std::string repl = need_string(r.at(1, "new"), "replace");
    out = Value(replace(s, old, repl, need_int(r.at(2, "count", Value(-1)), "replace")));
  } else if (name == "find" || name == "count") {
    const std::string& sub = need_string(r.at(0, "sub"), name);
    if (name == "find") {
      const size_t p = s.find(sub);
      out =
          Value(p == std::string::npos ? int64_t(-1) : int64_t(code_points(s.substr(0, p)).size()));
    } else {
      int64_t n = 0;
      if (sub.empty()) {
        n = int64_t(code_points(s).size()) + 1;
      } else {
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      }
      out = Value(n);
    }
  } else if (name == "join") {
    std::string j;
    const List items = iterate(r.at(0, "iterable"));
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) j += s;
      j += need_string(items[i], "str.join");
      if (j.size() > kMaxSize) fail("join: result too large");
    }
    out = Value(j);
  } else {
    fail("str has no method '", name, "'");
  }
  r.done();
  return out;
}

Value dict_method(const Value& d, const std::string& name, Args& a) {
  ArgReader r(a, "dict." + name);
  Value out;
  if (name == "items" || name == "keys" || name == "values") {
    List l;
    for (const auto& [k, v] : d.as_dict().items)
      l.push_back(name == "items"  ? Value::tuple(List{Value(k), v})
                  : name == "keys" ? Value(k)
                                   : v);
    out = Value(std::move(l));
  } else {
    const Value key = r.at(0, "key");
    const Value def = r.at(1, "default", Value::none());
    const Value* v = key.is_string() ? d.as_dict().find(key.as_string()) : nullptr;
    out = v ? *v : def;
  }
  r.done();
  return out;
}

const char* const kStringMethods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip",
                                      "split",      "lower",    "upper", "title",  "capitalize",
                                      "replace",    "find",     "count", "join"};
const char* const kDictMethods[] = {"items", "keys", "values", "get"};

template <size_t N>
bool in(const char* const (&names)[N], const std::string& n) {
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

int compare_values(const Value& a, const Value& b, bool case_sensitive = true) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const std::string x = case_sensitive ? a.as_string() : lower_ascii(a.as_string());
    const std::string y = case_sensitive ? b.as_string() : lower_ascii(b.as_string());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (int c = compare_values(x[i], y[i], case_sensitive)) return c;
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'<' is not supported between '", a.type_name(), "' and '", b.type_name(), "'");
}

// Jinja's attribute paths in filters: "a.b.0" looks up a, then b, then index 0.
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? get_item(cur, Value(int64_t(std::stoll(part.size() > 18 ? "-1" : part))))
                 : get_item(cur, Value(part));
    if (dot == std::string::npos || cur.is_undefined()) return cur;
    start = dot + 1;
  }
}

std::string str_join(const List& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i].str();
    if (out.size() > kMaxSize) fail("join: result too large");
  }
  return out;
}

// select/reject/selectattr/rejectattr: the test named by the first remaining argument (truth
// when none), applied to each item or its attribute.
Value select(const Value& v, Args& a, bool by_attr, bool keep, const std::string& what) {
  if (a.pos.size() < (by_attr ? 1u : 0u)) fail(what, " needs an attribute name");
  if (!a.kw.empty()) fail(what, " takes no keyword arguments");
  const std::string attr = by_attr ? need_string(a.pos[0], what) : "";
  const size_t t0 = by_attr ? 1 : 0;
  std::string test;
  if (a.pos.size() > t0) test = need_string(a.pos[t0], what);
  if (!test.empty() && !has_test(test)) fail(what, ": no test named '", test, "'");
  List out;
  for (const Value& item : iterate(v)) {
    const Value x = by_attr ? attr_path(item, attr) : item;
    bool ok;
    if (test.empty()) {
      ok = x.truthy();
    } else {
      Args ta;
      ta.pos.assign(a.pos.begin() + long(t0) + 1, a.pos.end());
      ok = apply_test(test, x, ta);
    }
    if (ok == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

Value indent(const std::string& s0, const Value& width, bool first, bool blank) {
  const std::string ind =
      width.is_string()
          ? width.as_string()
          : std::string(size_t(std::clamp<int64_t>(need_int(width, "indent"), 0, 1024)), ' ');
  // Python's splitlines() of s + "\n": the lines, without a trailing empty one.
  std::vector<std::string> lines;
  const std::string s = s0 + "\n";
  size_t start = 0;
  for (size_t p; (p = s.find('\n', start)) != std::string::npos; start = p + 1)
    lines.push_back(s.substr(start, p - start));
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind) + lines[i];
  }
  if (rv.size() > kMaxSize) fail("indent: result too large");
  return Value(first ? ind + rv : rv);
}

Value to_int(const Value& v, const Value& def) {
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return def;
    return Value(int64_t(d));
  }
  if (v.is_string()) {
    const std::string t = strip(v.as_string(), Value(), true, true);
    try {
      size_t used = 0;
      const int64_t i = std::stoll(t, &used);
      if (used == t.size()) return Value(i);
      const double d = std::stod(t, &used);
      if (used == t.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(int64_t(d));
    } catch (const std::exception&) {
    }
  }
  return def;
}

Value to_float(const Value& v, const Value& def) {
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    const std::string t = strip(v.as_string(), Value(), true, true);
    try {
      size_t used = 0;
      const double d = std::stod(t, &used);
      if (used == t.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return def;
}

using FilterFn = Value (*)(const Value&, ArgReader&, Args&);

// String filters convert their input with str(), as Jinja's soft_str does (undefined: "").
std::string need_str_arg(const Value& v, const char*) {
  return v.str();
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> f = {
      {"trim",
       [](const Value& v, ArgReader& r, Args&) {
         return Value(strip(need_str_arg(v, "trim"), r.at(0, "chars"), true, true));
       }},
      {"length",
       [](const Value& v, ArgReader&, Args&) {
         if (v.is_string()) return Value(int64_t(code_points(v.as_string()).size()));
         if (v.is_list()) return Value(int64_t(v.as_list().size()));
         if (v.is_mapping()) return Value(int64_t(v.as_dict().items.size()));
         if (v.is_undefined()) return Value(int64_t(0));
         fail("object of type '", v.type_name(), "' has no len()");
       }},
      {"tojson",
       [](const Value& v, ArgReader& r, Args&) {
         JsonStyle st;
         st.ensure_ascii = r.at(0, "ensure_ascii", Value(false)).truthy();
         const Value ind = r.at(1, "indent", Value::none());
         if (!ind.is_none())
           st.indent = int(std::clamp<int64_t>(need_int(ind, "tojson indent"), 0, 64));
         const Value sep = r.at(2, "separators", Value::none());
         if (!sep.is_none()) {
           if (!sep.is_list() || sep.as_list().size() != 2)
             fail("tojson: separators must be a pair of strings");
           st.item_sep = need_string(sep.as_list()[0], "tojson separators");
           st.key_sep = need_string(sep.as_list()[1], "tojson separators");
           if (st.item_sep.empty() || st.key_sep.empty())
             fail("tojson: empty separators are not supported");
         }
         st.sort_keys = r.at(3, "sort_keys", Value(false)).truthy();
         return Value(to_json(v, st));
       }},
      {"upper", [](const Value& v, ArgReader&,
                   Args&) { return Value(upper_ascii(need_str_arg(v, "upper"))); }},
      {"lower", [](const Value& v, ArgReader&,
                   Args&) { return Value(lower_ascii(need_str_arg(v, "lower"))); }},
      {"capitalize", [](const Value& v, ArgReader&,
                        Args&) { return Value(capitalize(need_str_arg(v, "capitalize"))); }},
      {"title",
       [](const Value& v, ArgReader&, Args&) {
         // Jinja's title: each word (split at whitespace, '-', '(', '{', '[', '<') gets its first
         // character upper-cased and the rest lower-cased.
         std::string s = need_str_arg(v, "title"), out;
         bool start = true;
         for (char c : s) {
           const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' ||
                            (c >= 0x09 && c <= 0x0D) || c == ' ' || (c >= 0x1C && c <= 0x1F);
           if (sep) {
             out += c;
             start = true;
           } else {
             out += start ? upper_ascii(std::string(1, c)) : lower_ascii(std::string(1, c));
             start = false;
           }
         }
         return Value(out);
       }},
      {"default",
       [](const Value& v, ArgReader& r, Args&) {
         const Value def = r.at(0, "default_value", Value(""));
         const bool boolean = r.at(1, "boolean", Value(false)).truthy();
         return v.is_undefined() || (boolean && !v.truthy()) ? def : v;
       }},
      {"join",
       [](const Value& v, ArgReader& r, Args&) {
         const Value sep = r.at(0, "d", Value(""));
         const Value attr = r.at(1, "attribute", Value::none());
         List items = iterate(v);
         if (!attr.is_none())
           for (Value& x : items) x = attr_path(x, attr.str());
         return Value(str_join(items, sep.str()));
       }},
      {"list", [](const Value& v, ArgReader&, Args&) { return Value(iterate(v)); }},
      {"items",
       [](const Value& v, ArgReader&, Args&) {
         if (v.is_undefined()) return Value(List{});
         if (!v.is_mapping()) fail("items expects a mapping, got ", v.type_name());
         List l;
         for (const auto& [k, x] : v.as_dict().items) l.push_back(Value::tuple(List{Value(k), x}));
         return Value(std::move(l));
       }},
      {"dictsort",
       [](const Value& v, ArgReader& r, Args&) {
         const bool cs = r.at(0, "case_sensitive", Value(false)).truthy();
         const std::string by = r.at(1, "by", Value("key")).str();
         const bool rev = r.at(2, "reverse", Value(false)).truthy();
         if (!v.is_mapping()) fail("dictsort expects a mapping, got ", v.type_name());
         List l;
         for (const auto& [k, x] : v.as_dict().items) l.push_back(Value::tuple(List{Value(k), x}));
         const size_t i = by == "value" ? 1 : 0;
         std::stable_sort(l.begin(), l.end(), [&](const Value& a, const Value& b) {
           const int c = compare_values(a.as_list()[i], b.as_list()[i], cs);
           return rev ? c > 0 : c < 0;
         });
         return Value(std::move(l));
       }},
      {"selectattr",
       [](const Value& v, ArgReader&, Args& a) { return select(v, a, true, true, "selectattr"); }},
      {"rejectattr",
       [](const Value& v, ArgReader&, Args& a) { return select(v, a, true, false, "rejectattr"); }},
      {"select",
       [](const Value& v, ArgReader&, Args& a) { return select(v, a, false, true, "select"); }},
      {"reject",
       [](const Value& v, ArgReader&, Args& a) { return select(v, a, false, false, "reject"); }},
      {"map",
       [](const Value& v, ArgReader&, Args& a) {
         List out;
         Value attr, def;
         for (auto& [k, x] : a.kw) {
           if (k == "attribute")
             attr = x;
           else if (k == "default")
             def = x;
           else
             fail("map got an unexpected keyword '", k, "'");
         }
         if (!attr.is_undefined()) {
           if (!a.pos.empty()) fail("map takes no positional arguments with attribute=");
           for (const Value& item : iterate(v)) {
             Value x = attr_path(item, attr.str());
             out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
           }
           return Value(std::move(out));
         }
         if (a.pos.empty()) fail("map needs a filter name or attribute=");
         const std::string f = need_string(a.pos[0], "map");
         if (!has_filter(f)) fail("map: no filter named '", f, "'");
         for (const Value& item : iterate(v)) {
           Args fa;
           fa.pos.assign(a.pos.begin() + 1, a.pos.end());
           out.push_back(apply_filter(f, item, fa));
         }
         return Value(std::move(out));
       }},
      {"first",
       [](const Value& v, ArgReader&, Args&) {
         const List l = iterate(v);
         return l.empty() ? Value::undefined("first") : l.front();
       }},
      {"last",
       [](const Value& v, ArgReader&, Args&) {
         const List l = iterate(v);
         return l.empty() ? Value::undefined("last") : l.back();
       }},
      {"replace",
       [](const Value& v, ArgReader& r, Args&) {
         const std::string old = r.at(0, "old").str(), repl = r.at(1, "new").str();
         const Value count = r.at(2, "count", Value::none());
         return Value(replace(need_str_arg(v, "replace"), old, repl,
                              count.is_none() ? -1 : need_int(count, "replace")));
       }},
      {"string", [](const Value& v, ArgReader&, Args&) { return Value(v.str()); }},
      {"safe", [](const Value& v, ArgReader&, Args&) { return v; }},
      {"int", [](const Value& v, ArgReader& r,
                 Args&) { return to_int(v, r.at(0, "default", Value(int64_t(0)))); }},
      {"float", [](const Value& v, ArgReader& r,
                   Args&) { return to_float(v, r.at(0, "default", Value(0.0))); }},
      {"abs",
       [](const Value& v, ArgReader&, Args&) {
         if (v.is_float()) return Value(std::fabs(v.as_double()));
         const int64_t i = need_int(v, "abs");
         if (i == INT64_MIN) fail("abs: integer overflow");
         return Value(i < 0 ? -i : i);
       }},
      {"reverse",
       [](const Value& v, ArgReader&, Args&) {
         if (v.is_string()) {
           std::vector<uint32_t> cps = code_points(v.as_string());
           std::reverse(cps.begin(), cps.end());
           return Value(from_code_points(cps, 0, cps.size()));
         }
         List l = iterate(v);
         std::reverse(l.begin(), l.end());
         return Value(std::move(l));
       }},
      {"sort",
       [](const Value& v, ArgReader& r, Args&) {
         const bool rev = r.at(0, "reverse", Value(false)).truthy();
         const bool cs = r.at(1, "case_sensitive", Value(false)).truthy();
         const Value attr = r.at(2, "attribute", Value::none());
         List l = iterate(v);
         auto key = [&](const Value& x) { return attr.is_none() ? x : attr_path(x, attr.str()); };
         std::stable_sort(l.begin(), l.end(), [&](const Value& a, const Value& b) {
           const int c = compare_values(key(a), key(b), cs);
           return rev ? c > 0 : c < 0;
         });
         return Value(std::move(l));
       }},
      {"unique",
       [](const Value& v, ArgReader& r, Args&) {
         const bool cs = r.at(0, "case_sensitive", Value(false)).truthy();
         const Value attr = r.at(1, "attribute", Value::none());
         List out, keys;
         for (const Value& x : iterate(v)) {
           Value k = attr.is_none() ? x : attr_path(x, attr.str());
           if (!cs && k.is_string()) k = Value(lower_ascii(k.as_string()));
           bool seen = false;
           for (const Value& s : keys) seen |= equal(s, k);
           if (!seen) {
             keys.push_back(k);
             out.push_back(x);
           }
         }
         return Value(std::move(out));
       }},
      {"min",
       [](const Value& v, ArgReader& r, Args&) {
         const bool cs = r.at(0, "case_sensitive", Value(false)).truthy();
         const List l = iterate(v);
         if (l.empty()) return Value::undefined("min");
         Value best = l[0];
         for (const Value& x : l)
           if (compare_values(x, best, cs) < 0) best = x;
         return best;
       }},
      {"max",
       [](const Value& v, ArgReader& r, Args&) {
         const bool cs = r.at(0, "case_sensitive", Value(false)).truthy();
         const List l = iterate(v);
         if (l.empty()) return Value::undefined("max");
         Value best = l[0];
         for (const Value& x : l)
           if (compare_values(x, best, cs) > 0) best = x;
         return best;
       }},
      {"sum",
       [](const Value& v, ArgReader& r, Args&) {
         const Value attr = r.at(0, "attribute", Value::none());
         Value total = r.at(1, "start", Value(int64_t(0)));
         for (const Value& x : iterate(v)) {
           const Value y = attr.is_none() ? x : attr_path(x, attr.str());
           if (!total.is_number() || !y.is_number())
             fail("sum expects numbers, got ", y.type_name());
           if (total.is_float() || y.is_float()) {
             total = Value(total.as_double() + y.as_double());
           } else {
             int64_t s = 0;
             if (__builtin_add_overflow(total.as_int(), y.as_int(), &s))
               fail("sum: integer overflow");
             total = Value(s);
           }
         }
         return total;
       }},
      {"indent",
       [](const Value& v, ArgReader& r, Args&) {
         const Value width = r.at(0, "width", Value(int64_t(4)));
         const bool first = r.at(1, "first", Value(false)).truthy();
         const bool blank = r.at(2, "blank", Value(false)).truthy();
         return indent(need_str_arg(v, "indent"), width, first, blank);
       }},
  };
  return f;
}

const std::map<std::string, std::string>& filter_aliases() {
  static const std::map<std::string, std::string> a = {{"d", "default"}, {"count", "length"}};
  return a;
}

using TestFn = bool (*)(const Value&, ArgReader&);

Value arg0(ArgReader& r) {
  Value v = r.at(0, "value");
  need_defined(v);
  return v;
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> t = {
      {"defined", [](const Value& v, ArgReader&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, ArgReader&) { return v.is_undefined(); }},
      {"none", [](const Value& v, ArgReader&) { return v.is_none(); }},
      {"boolean", [](const Value& v, ArgReader&) { return v.is_bool(); }},
      {"true", [](const Value& v, ArgReader&) { return v.is_bool() && v.as_bool(); }},
      {"false", [](const Value& v, ArgReader&) { return v.is_bool() && !v.as_bool(); }},
      {"integer", [](const Value& v, ArgReader&) { return v.is_int(); }},
      {"float", [](const Value& v, ArgReader&) { return v.is_float(); }},
      {"number", [](const Value& v, ArgReader&) { return v.is_number(); }},
      {"string", [](const Value& v, ArgReader&) { return v.is_string(); }},
      {"mapping", [](const Value& v, ArgReader&) { return v.is_dict(); }},
      {"iterable",
       [](const Value& v, ArgReader&) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"sequence",
       [](const Value& v, ArgReader&) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"callable", [](const Value& v, ArgReader&) { return v.is_callable(); }},
      {"even", [](const Value& v, ArgReader&) { return need_int(v, "even") % 2 == 0; }},
      {"odd", [](const Value& v, ArgReader&) { return need_int(v, "odd") % 2 != 0; }},
      {"divisibleby",
       [](const Value& v, ArgReader& r) {
         const int64_t d = need_int(r.at(0, "num"), "divisibleby");
         if (d == 0) fail("divisibleby 0");
         return need_int(v, "divisibleby") % d == 0;
       }},
      {"eq", [](const Value& v, ArgReader& r) { return equal(v, r.at(0, "other")); }},
      {"ne", [](const Value& v, ArgReader& r) { return !equal(v, r.at(0, "other")); }},
      {"lt", [](const Value& v, ArgReader& r) { return compare_values(v, arg0(r)) < 0; }},
      {"le", [](const Value& v, ArgReader& r) { return compare_values(v, arg0(r)) <= 0; }},
      {"gt", [](const Value& v, ArgReader& r) { return compare_values(v, arg0(r)) > 0; }},
      {"ge", [](const Value& v, ArgReader& r) { return compare_values(v, arg0(r)) >= 0; }},
      {"in",
       [](const Value& v, ArgReader& r) {
         const Value seq = r.at(0, "seq");
         if (seq.is_string())
           return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
         if (seq.is_mapping()) return v.is_string() && seq.as_dict().find(v.as_string()) != nullptr;
         for (const Value& x : iterate(seq))
           if (equal(x, v)) return true;
         return false;
       }},
      {"sameas",
       [](const Value& v, ArgReader& r) {
         const Value o = r.at(0, "other");
         if (v.is_none() || v.is_bool() || o.is_none() || o.is_bool())
           return v.kind() == o.kind() && (v.is_none() || v.as_bool() == o.as_bool());
         return equal(v, o) && v.kind() == o.kind();
       }},
      {"lower",
       [](const Value& v, ArgReader&) {
         return v.is_string() && lower_ascii(v.as_string()) == v.as_string();
       }},
      {"upper",
       [](const Value& v, ArgReader&) {
         return v.is_string() && upper_ascii(v.as_string()) == v.as_string();
       }},
  };
  return t;
}

const std::map<std::string, std::string>& test_aliases() {
  static const std::map<std::string, std::string> a = {
      {"equalto", "eq"}, {"==", "eq"},          {"!=", "ne"}, {"lessthan", "lt"}, {"<", "lt"},
      {"<=", "le"},      {"greaterthan", "gt"}, {">", "gt"},  {">=", "ge"}};
  return a;
}

std::string resolve(const std::string& n, const std::map<std::string, std::string>& aliases) {
  auto it = aliases.find(n);
  return it == aliases.end() ? n : it->second;
}

}  // namespace

void need_defined(const Value& v) {
  if (v.is_undefined())
    fail("'", v.undefined_name().empty() ? "value" : v.undefined_name(), "' is undefined");
}

Value ArgReader::at(size_t pos, const char* name, Value def) {
  max_pos_ = std::max(max_pos_, pos + 1);
  for (const auto& [k, v] : a_.kw)
    if (k == name) {
      if (pos < a_.pos.size()) fail(what_, " got '", name, "' twice");
      used_.push_back(k);
      return v;
    }
  return pos < a_.pos.size() ? a_.pos[pos] : def;
}

void ArgReader::done() {
  if (a_.pos.size() > max_pos_)
    fail(what_, " takes at most ", max_pos_, " positional argument", max_pos_ == 1 ? "" : "s",
         ", got ", a_.pos.size());
  for (const auto& [k, v] : a_.kw)
    if (std::find(used_.begin(), used_.end(), k) == used_.end())
      fail(what_, " got an unexpected keyword argument '", k, "'");
}

bool has_filter(const std::string& name) {
  return filters().count(resolve(name, filter_aliases())) > 0;
}
bool has_test(const std::string& name) {
  return tests().count(resolve(name, test_aliases())) > 0;
}

Value apply_filter(const std::string& name, const Value& v, Args& args) {
  const auto it = filters().find(resolve(name, filter_aliases()));
  if (it == filters().end()) fail("no filter named '", name, "'");
  ArgReader r(args, "filter '" + name + "'");
  Value out = it->second(v, r, args);
  // map and the select family read their arguments themselves (a test's or filter's follow).
  const std::string& n = it->first;
  if (n != "map" && n != "select" && n != "reject" && n != "selectattr" && n != "rejectattr")
    r.done();
  return out;
}

bool apply_test(const std::string& name, const Value& v, Args& args) {
  const auto it = tests().find(resolve(name, test_aliases()));
  if (it == tests().end()) fail("no test named '", name, "'");
  ArgReader r(args, "test '" + name + "'");
  const bool out = it->second(v, r);
  r.done();
  return out;
}

Value get_attr(const Value& obj, const std::string& name) {
  need_defined(obj);
  if (obj.is_string() && in(kStringMethods, name)) {
    const std::string s = obj.as_string();
    return Value::function("str." + name, [s, name](Args& a) { return string_method(s, name, a); });
  }
  if (obj.is_dict() && in(kDictMethods, name))
    return Value::function("dict." + name,
                           [obj, name](Args& a) { return dict_method(obj, name, a); });
  if (obj.is_mapping()) {
    const Value* v = obj.as_dict().find(name);
    return v ? *v : Value::undefined(name);
  }
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key) {
  need_defined(obj);
  if (obj.is_mapping()) {
    if (key.is_string()) {
      const Value* v = obj.as_dict().find(key.as_string());
      if (v) return *v;
    }
    return Value::undefined(key.str());
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    if (obj.is_list()) {
      const List& l = obj.as_list();
      int64_t i = key.as_int();
      if (i < 0) i += int64_t(l.size());
      if (i < 0 || i >= int64_t(l.size())) return Value::undefined(key.str());
      return l[size_t(i)];
    }
    const std::vector<uint32_t> cps = code_points(obj.as_string());
    int64_t i = key.as_int();
    if (i < 0) i += int64_t(cps.size());
    if (i < 0 || i >= int64_t(cps.size())) return Value::undefined(key.str());
    return Value(from_code_points(cps, size_t(i), size_t(i) + 1));
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(key.str());
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  need_defined(obj);
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    return need_int(v, what);
  };
  const std::optional<int64_t> a = opt(start, "slice"), b = opt(stop, "slice"),
                               s = opt(step, "slice");
  const int64_t st = s.value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  std::vector<uint32_t> cps;
  const bool str = obj.is_string();
  if (str)
    cps = code_points(obj.as_string());
  else if (!obj.is_list())
    fail("'", obj.type_name(), "' object is not subscriptable");
  const int64_t n = str ? int64_t(cps.size()) : int64_t(obj.as_list().size());
  // Python's slice.indices().
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v < 0 ? *v + n : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t lo = clamp(a, st > 0 ? 0 : n - 1), hi = clamp(b, st > 0 ? n : -1);
  List items;
  std::vector<uint32_t> out;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
    if (str)
      out.push_back(cps[size_t(i)]);
    else
      items.push_back(obj.as_list()[size_t(i)]);
  }
  if (str) return Value(from_code_points(out, 0, out.size()));
  return Value(std::move(items));
}

List iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.as_list();
  if (v.is_dict()) {
    List l;
    for (const auto& kv : v.as_dict().items) l.emplace_back(kv.first);
    return l;
  }
  if (v.is_string()) {
    const std::vector<uint32_t> cps = code_points(v.as_string());
    List l;
    for (size_t i = 0; i < cps.size(); ++i) l.emplace_back(from_code_points(cps, i, i + 1));
    return l;
  }
  fail("'", v.type_name(), "' object is not iterable");
}

Value global_function(const std::string& name) {
  if (name == "range")
    return Value::function("range", [](Args& a) {
      if (!a.kw.empty()) fail("range takes no keyword arguments");
      if (a.pos.empty() || a.pos.size() > 3) fail("range expects 1 to 3 arguments");
      int64_t start = 0, stop, step = 1;
      if (a.pos.size() == 1) {
        stop = need_int(a.pos[0], "range");
      } else {
        start = need_int(a.pos[0], "range");
        stop = need_int(a.pos[1], "range");
        if (a.pos.size() == 3) step = need_int(a.pos[2], "range");
      }
      if (step == 0) fail("range step cannot be zero");
      List l;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (l.size() >= (size_t(1) << 20)) fail("range: more than 2^20 items");
        l.emplace_back(i);
      }
      return Value(std::move(l));
    });
  if (name == "namespace" || name == "dict")
    return Value::function(name, [name](Args& a) {
      Dict d;
      for (const Value& p : a.pos) {
        if (!p.is_mapping()) fail(name, "() takes keyword arguments or a dict");
        for (const auto& [k, v] : p.as_dict().items) d.set(k, v);
      }
      for (auto& [k, v] : a.kw) d.set(k, v);
      return name == "dict" ? Value(std::move(d)) : Value::make_namespace(std::move(d));
    });
  return Value::undefined(name);
}

}  // namespace loom::data::jinja
