#include "infer/constrain/json_schema.h"

#include <cmath>
#include <set>
#include <string>

#include "core/error.h"
#include "infer/constrain/regex_parser.h"

namespace loom::infer::constrain {

namespace {

Rx ws() {
  return rx_opt(rx_literal(" "));
}
Rx sep() {
  return rx_seq({rx_literal(","), ws()});
}
Rx colon() {
  return rx_seq({rx_literal(":"), ws()});
}
Rx re(std::string_view pattern) {
  return parse_regex(pattern).rx;
}

Rx any_char() {  // one character of a JSON string: itself or a short escape
  return rx_alt({json_string_chars({{0x20, kMaxCodePoint}}), re(R"(\\[/bfnrt])")});
}
Rx any_string() {
  return rx_seq({rx_literal("\""), rx_star(any_char()), rx_literal("\"")});
}

Rx digits(int lo, int hi) {
  return rx_rep(rx_byte_range('0', '9'), lo, hi);
}
constexpr int kIntDigits = 16;
constexpr int64_t kIntCap = 9999999999999999;  // 16 digits

Rx fraction_exponent() {
  return rx_seq({rx_opt(rx_seq({rx_literal("."), digits(1, 16)})),
                 rx_opt(rx_seq({re("[eE][+-]?"), digits(1, 2)}))});
}
Rx natural() {  // 0 | [1-9][0-9]{0,15}
  return rx_alt({rx_literal("0"), rx_seq({rx_byte_range('1', '9'), digits(0, kIntDigits - 1)})});
}

bool all_of(const std::string& s, size_t from, char c) {
  return s.find_first_not_of(c, from) == std::string::npos;
}

// Decimal strings from a to b, both of the same length (linear in it: a run of full digit
// ranges is one repetition).
Rx same_length(const std::string& a, const std::string& b) {
  const int n = static_cast<int>(a.size());
  if (n == 0) return rx_empty();
  if (all_of(a, 0, '0') && all_of(b, 0, '9')) return digits(n, n);
  if (a[0] == b[0])
    return rx_seq({rx_literal(a.substr(0, 1)), same_length(a.substr(1), b.substr(1))});
  std::vector<Rx> alts;
  char from = a[0], to = b[0];
  if (!all_of(a, 1, '0')) {
    alts.push_back(rx_seq(
        {rx_literal(a.substr(0, 1)), same_length(a.substr(1), std::string(size_t(n - 1), '9'))}));
    ++from;
  }
  const bool tail = !all_of(b, 1, '9');
  if (tail) --to;
  if (from <= to)
    alts.push_back(
        rx_seq({rx_byte_range(static_cast<unsigned char>(from), static_cast<unsigned char>(to)),
                digits(n - 1, n - 1)}));
  if (tail)
    alts.push_back(rx_seq(
        {rx_literal(b.substr(0, 1)), same_length(std::string(size_t(n - 1), '0'), b.substr(1))}));
  return rx_alt(std::move(alts));
}

// Non-negative integers lo..hi without leading zeros.
Rx natural_range(int64_t lo, int64_t hi) {
  std::vector<Rx> alts;
  int64_t p = 1;  // 10^(L-1)
  for (int len = 1; len <= 19 && lo <= hi; ++len, p *= 10) {
    const int64_t top = len == 19 ? INT64_MAX : p * 10 - 1;
    const int64_t a = std::max(lo, len == 1 ? 0 : p), b = std::min(hi, top);
    if (a <= b) alts.push_back(same_length(std::to_string(a), std::to_string(b)));
    if (top >= hi) break;
  }
  return rx_alt(std::move(alts));
}

Rx integer_range(int64_t lo, int64_t hi) {
  std::vector<Rx> alts;
  if (lo < 0)
    alts.push_back(rx_seq({rx_literal("-"), natural_range(std::max<int64_t>(1, -hi), -lo)}));
  if (hi >= 0) alts.push_back(natural_range(std::max<int64_t>(lo, 0), hi));
  return rx_alt(std::move(alts));
}

Rx any_value(int depth) {
  std::vector<Rx> alts{any_string(),
                       rx_seq({rx_opt(rx_literal("-")), natural(), fraction_exponent()}),
                       rx_literal("true"), rx_literal("false"), rx_literal("null")};
  if (depth > 0) {
    Rx member = rx_seq({any_string(), colon(), any_value(depth - 1)});
    Rx members = rx_opt(rx_seq({member, rx_star(rx_seq({sep(), member}))}));
    alts.push_back(rx_seq({rx_literal("{"), members, rx_literal("}")}));
    Rx item = any_value(depth - 1);
    alts.push_back(rx_seq({rx_literal("["), rx_opt(rx_seq({item, rx_star(rx_seq({sep(), item}))})),
                           rx_literal("]")}));
  }
  return rx_alt(std::move(alts));
}

const std::set<std::string> kAnnotations{"title",    "description", "default",  "examples",
                                         "$schema",  "$id",         "$comment", "deprecated",
                                         "readOnly", "writeOnly"};

class Compiler {
 public:
  Compiler(const Json& root, int any_depth) : root_(root), depth_(any_depth) {}

  Rx schema(const Json& s, const std::string& at) {
    if (s.type() == Json::Type::Bool) {
      if (!s.as_bool()) fail(at, "the schema false (nothing is valid)");
      return any_value(depth_);
    }
    if (!s.is_object()) fail(at, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.as_object()) check_known(k, at);
    if (s.contains("$ref")) return ref(s, at);
    if (s.contains("allOf")) {
      const Json& all = s.at("allOf");
      if (!all.is_array() || all.size() != 1 || s.as_object().size() > 1 + annotations(s))
        fail(at + "/allOf", "'allOf' of more than one schema (or beside other keywords)");
      return schema(all.as_array()[0], at + "/allOf/0");
    }
    if (s.contains("anyOf")) {
      const Json& any = s.at("anyOf");
      if (!any.is_array() || any.size() == 0)
        fail(at + "/anyOf", "'anyOf' must be a non-empty array");
      std::vector<Rx> alts;
      for (size_t i = 0; i < any.size(); ++i)
        alts.push_back(schema(any.as_array()[i], cat(at, "/anyOf/", i)));
      return rx_alt(std::move(alts));
    }
    if (s.contains("const")) return rx_literal(s.at("const").dump());
    if (s.contains("enum")) {
      const Json& e = s.at("enum");
      if (!e.is_array() || e.size() == 0) fail(at + "/enum", "'enum' must be a non-empty array");
      std::vector<Rx> alts;
      for (const Json& v : e.as_array()) alts.push_back(rx_literal(v.dump()));
      return rx_alt(std::move(alts));
    }
    if (!s.contains("type")) {
      // Keywords that imply a type (properties, items, ...) without "type" say nothing about
      // other types; the value is then any JSON (only the implied type's keywords are checked).
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        return typed(s, "object", at);
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems"))
        return typed(s, "array", at);
      if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
          s.contains("maxLength"))
        return typed(s, "string", at);
      return any_value(depth_);
    }
    const Json& t = s.at("type");
    if (t.is_string()) return typed(s, t.as_string(), at);
    if (!t.is_array() || t.size() == 0)
      fail(at + "/type", "'type' must be a string or a non-empty array of strings");
    std::vector<Rx> alts;
    for (const Json& x : t.as_array()) {
      if (!x.is_string()) fail(at + "/type", "'type' must be a string or an array of strings");
      alts.push_back(typed(s, x.as_string(), at));
    }
    return rx_alt(std::move(alts));
  }

 private:
  [[noreturn]] static void fail(const std::string& at, const std::string& what) {
    throw Error(cat("json_schema: ", what, " at ", at.empty() ? "#" : "#" + at));
  }

  static size_t annotations(const Json& s) {
    size_t n = 0;
    for (const auto& [k, v] : s.as_object()) n += kAnnotations.count(k);
    return n;
  }

  static void check_known(const std::string& k, const std::string& at) {
    static const std::set<std::string> known{"type",
                                             "properties",
                                             "required",
                                             "additionalProperties",
                                             "enum",
                                             "const",
                                             "items",
                                             "minItems",
                                             "maxItems",
                                             "anyOf",
                                             "allOf",
                                             "$ref",
                                             "$defs",
                                             "definitions",
                                             "minLength",
                                             "maxLength",
                                             "pattern",
                                             "format",
                                             "minimum",
                                             "maximum",
                                             "exclusiveMinimum",
                                             "exclusiveMaximum"};
    if (known.count(k) || kAnnotations.count(k)) return;
    if (k == "oneOf")
      fail(at + "/oneOf",
           "unsupported keyword 'oneOf' (its branches' exclusivity is not "
           "expressible here; use 'anyOf')");
    fail(at + "/" + k, "unsupported keyword '" + k + "'");
  }

  Rx ref(const Json& s, const std::string& at) {
    if (!s.at("$ref").is_string()) fail(at + "/$ref", "'$ref' must be a string");
    const std::string r = s.at("$ref").as_string();
    std::string section, name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"})
      if (r.rfind(prefix, 0) == 0) {
        section = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        name = r.substr(std::string(prefix).size());
      }
    if (section.empty() || !root_.is_object() || !root_.contains(section) ||
        !root_.at(section).is_object() || !root_.at(section).contains(name))
      fail(at + "/$ref", "'$ref' " + r + " does not name an entry of $defs or definitions");
    const size_t defs = s.contains("$defs") + s.contains("definitions");
    if (s.as_object().size() > 1 + annotations(s) + defs)
      fail(at + "/$ref", "'$ref' beside other keywords");
    if (open_refs_.count(r)) fail(at + "/$ref", "a recursive '$ref' " + r);
    open_refs_.insert(r);
    Rx out = schema(root_.at(section).at(name), "/" + section + "/" + name);
    open_refs_.erase(r);
    return out;
  }

  static int64_t count(const Json& s, const std::string& key, const std::string& at) {
    const Json& v = s.at(key);
    if (v.type() != Json::Type::Int || v.as_int() < 0 || v.as_int() > 10000)
      fail(at + "/" + key, "'" + key + "' must be an integer in [0, 10000]");
    return v.as_int();
  }

  Rx typed(const Json& s, const std::string& type, const std::string& at) {
    if (type == "string") return string(s, at);
    if (type == "integer") return integer(s, at);
    if (type == "number") {
      for (const char* k : {"maximum", "exclusiveMinimum", "exclusiveMaximum"})
        if (s.contains(k)) fail(at + "/" + k, cat("unsupported keyword '", k, "' on a number"));
      bool nonneg = false;
      if (s.contains("minimum")) {
        const Json& m = s.at("minimum");
        if (!m.is_number() || m.as_double() != 0)
          fail(at + "/minimum", "unsupported keyword 'minimum' on a number (only 0 is taken)");
        nonneg = true;
      }
      return rx_seq(
          {nonneg ? rx_empty() : rx_opt(rx_literal("-")), natural(), fraction_exponent()});
    }
    if (type == "boolean") return rx_alt({rx_literal("true"), rx_literal("false")});
    if (type == "null") return rx_literal("null");
    if (type == "object") return object(s, at);
    if (type == "array") return array(s, at);
    fail(at + "/type", "unknown type '" + type + "'");
  }

  Rx string(const Json& s, const std::string& at) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    const int min = s.contains("minLength") ? int(count(s, "minLength", at)) : 0;
    const int max = s.contains("maxLength") ? int(count(s, "maxLength", at)) : -1;
    if (max >= 0 && max < min) fail(at + "/maxLength", "'maxLength' below 'minLength'");
    if ((s.contains("pattern") || s.contains("format")) && has_len)
      fail(at + (s.contains("pattern") ? "/pattern" : "/format"),
           "'pattern' or 'format' together with 'minLength' / 'maxLength'");
    if (s.contains("pattern") && s.contains("format"))
      fail(at + "/pattern", "'pattern' together with 'format'");
    Rx body;
    if (s.contains("pattern")) {
      if (!s.at("pattern").is_string()) fail(at + "/pattern", "'pattern' must be a string");
      ParsedRegex p;
      try {
        p = parse_regex(s.at("pattern").as_string(), json_string_chars);
      } catch (const Error& e) {
        fail(at + "/pattern", std::string("unsupported 'pattern': ") + e.what());
      }
      // A pattern matches anywhere in the string unless anchored.
      body = rx_seq({p.anchored_start ? rx_empty() : rx_star(any_char()), std::move(p.rx),
                     p.anchored_end ? rx_empty() : rx_star(any_char())});
    } else if (s.contains("format")) {
      body = format(s.at("format"), at + "/format");
    } else {
      body = rx_rep(any_char(), min, max);
    }
    return rx_seq({rx_literal("\""), std::move(body), rx_literal("\"")});
  }

  static Rx format(const Json& f, const std::string& at) {
    if (!f.is_string()) fail(at, "'format' must be a string");
    const std::string& name = f.as_string();
    const char* date = R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]))";
    const char* time =
        R"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))";
    if (name == "date") return re(date);
    if (name == "time") return re(time);
    if (name == "date-time") return rx_seq({re(date), rx_literal("T"), re(time)});
    if (name == "uuid")
      return re("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}");
    if (name == "ipv4") {
      const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
      return re(octet + "(\\." + octet + "){3}");
    }
    if (name == "email") return re(R"([A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+)");
    fail(at, "unsupported format '" + name + "'");
  }

  static Rx integer(const Json& s, const std::string& at) {
    int64_t lo = -kIntCap, hi = kIntCap;
    auto bound = [&](const char* key) -> int64_t {
      const Json& v = s.at(key);
      if (!v.is_number()) fail(at + "/" + key, cat("'", key, "' must be a number"));
      const double d = v.as_double();
      if (!(std::fabs(d) <= double(kIntCap)))
        fail(at + "/" + key, cat("'", key, "' beyond 16 digits"));
      return int64_t(std::string(key).find("Min") != std::string::npos ||
                             std::string(key) == "minimum"
                         ? std::ceil(d)
                         : std::floor(d));
    };
    if (s.contains("minimum")) lo = std::max(lo, bound("minimum"));
    if (s.contains("maximum")) hi = std::min(hi, bound("maximum"));
    for (const char* key : {"exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(key) && s.at(key).type() == Json::Type::Bool)
        fail(at + "/" + key, cat("the draft-4 boolean '", key, "' (use a number)"));
    if (s.contains("exclusiveMinimum")) {
      const double d = s.at("exclusiveMinimum").as_double();
      lo = std::max(lo, bound("exclusiveMinimum") + (std::ceil(d) == d ? 1 : 0));
    }
    if (s.contains("exclusiveMaximum")) {
      const double d = s.at("exclusiveMaximum").as_double();
      hi = std::min(hi, bound("exclusiveMaximum") - (std::floor(d) == d ? 1 : 0));
    }
    if (lo > hi) fail(at, "no integer lies within its bounds");
    return integer_range(lo, hi);
  }

  Rx object(const Json& s, const std::string& at) {
    const Json empty = Json::object();
    const Json& props = s.contains("properties") ? s.at("properties") : empty;
    if (!props.is_object()) fail(at + "/properties", "'properties' must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s.at("required");
      if (!r.is_array()) fail(at + "/required", "'required' must be an array of names");
      for (const Json& n : r.as_array()) {
        if (!n.is_string()) fail(at + "/required", "'required' must be an array of names");
        if (!props.contains(n.as_string()))
          fail(at + "/required",
               "required property '" + n.as_string() +
                   "' is not among 'properties' (only listed ones are generated)");
        required.insert(n.as_string());
      }
    }
    const Json* extra =
        s.contains("additionalProperties") ? &s.at("additionalProperties") : nullptr;
    if (props.size() == 0) {
      if (extra && extra->type() == Json::Type::Bool && !extra->as_bool()) return rx_literal("{}");
      // A map: any keys, values under additionalProperties (any value when absent or true).
      Rx value = extra && extra->is_object() ? schema(*extra, at + "/additionalProperties")
                                             : any_value(depth_ - 1);
      Rx member = rx_seq({any_string(), colon(), std::move(value)});
      return rx_seq({rx_literal("{"), rx_opt(rx_seq({member, rx_star(rx_seq({sep(), member}))})),
                     rx_literal("}")});
    }
    if (extra && extra->is_object()) schema(*extra, at + "/additionalProperties");  // checked
    std::vector<Rx> member;
    std::vector<bool> req;
    for (const auto& [name, sub] : props.as_object()) {
      std::string key;
      json_escape(key, name);
      member.push_back(rx_seq({rx_literal(key), colon(), schema(sub, at + "/properties/" + name)}));
      req.push_back(required.count(name) > 0);
    }
    // after[i]: the members from i on, some already written (each one present is preceded by
    // a comma). first[i]: the same with none written yet.
    const size_t n = member.size();
    std::vector<Rx> after(n + 1);
    for (size_t i = n; i-- > 0;) {
      Rx one = rx_seq({sep(), member[i]});
      after[i] = rx_seq({req[i] ? std::move(one) : rx_opt(std::move(one)), after[i + 1]});
    }
    Rx first = rx_empty();
    for (size_t i = n; i-- > 0;) {
      Rx here = rx_seq({member[i], after[i + 1]});
      first = req[i] ? std::move(here) : rx_alt({std::move(here), std::move(first)});
    }
    return rx_seq({rx_literal("{"), std::move(first), rx_literal("}")});
  }

  Rx array(const Json& s, const std::string& at) {
    const int min = s.contains("minItems") ? int(count(s, "minItems", at)) : 0;
    const int max = s.contains("maxItems") ? int(count(s, "maxItems", at)) : -1;
    if (max >= 0 && max < min) fail(at + "/maxItems", "'maxItems' below 'minItems'");
    if (s.contains("items") && s.at("items").is_array())
      fail(at + "/items", "'items' as an array (tuples; use prefixItems-free schemas)");
    Rx item = s.contains("items") ? schema(s.at("items"), at + "/items") : any_value(depth_ - 1);
    if (max == 0) return rx_literal("[]");
    Rx rest = rx_rep(rx_seq({sep(), item}), std::max(min - 1, 0), max < 0 ? -1 : max - 1);
    Rx some = rx_seq({item, std::move(rest)});
    return rx_seq(
        {rx_literal("["), min > 0 ? std::move(some) : rx_opt(std::move(some)), rx_literal("]")});
  }

  const Json& root_;
  int depth_;
  std::set<std::string> open_refs_;
};

}  // namespace

Rx json_string_chars(const CpRanges& cps) {
  // Characters JSON lets stand for themselves; the rest by their escapes.
  CpRanges plain;
  std::vector<Rx> alts;
  for (auto [lo, hi] : cp_normalize(cps)) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5C); ++c) {
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      static const char* const shorts[] = {"b", "t", "n", "", "f", "r"};  // 8..13
      if (c == '"')
        alts.push_back(rx_literal("\\\""));
      else if (c == '\\')
        alts.push_back(rx_literal("\\\\"));
      else if (c >= 8 && c <= 13 && c != 11)
        alts.push_back(rx_literal(std::string("\\") + shorts[c - 8]));
      else if (c < 0x20) {
        static const char* hexd = "0123456789abcdef";
        alts.push_back(rx_literal(std::string("\\u00") + hexd[c >> 4] + hexd[c & 15]));
      }
    }
    plain.push_back({lo, hi});
  }
  plain = cp_negate(cp_normalize([&] {
    CpRanges excluded = cp_negate(plain);
    excluded.push_back({0, 0x1F});
    excluded.push_back({'"', '"'});
    excluded.push_back({'\\', '\\'});
    return excluded;
  }()));
  if (!plain.empty()) alts.insert(alts.begin(), rx_utf8(plain));
  if (alts.empty()) return rx_utf8({});
  return rx_alt(std::move(alts));
}

Rx json_schema_rx(const Json& schema, int any_depth) {
  return Compiler(schema, any_depth).schema(schema, "");
}

Rx json_object_rx(int any_depth) {
  Json s = Json::object();
  s["type"] = "object";
  return json_schema_rx(s, any_depth);
}

}  // namespace loom::infer::constrain
