// An independent JSON Schema check for the tests of structured outputs: validates a parsed
// document against the subset Loom's grammar compiler takes, written from the specification
// (draft 2020-12) and sharing no code with the compiler. Returns "" when valid, else why not.
#pragma once

#include <cmath>
#include <regex>
#include <string>

#include "core/json.h"

namespace loom::test {

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline std::string schema_violation(const Json& v, const Json& s, const Json& root,
                                    const std::string& at = "$") {
  if (s.type() == Json::Type::Bool) return s.as_bool() ? "" : at + ": schema false";
  if (s.contains("$ref")) {
    std::string r = s.at("$ref").as_string();
    const std::string sec = r.rfind("#/$defs/", 0) == 0 ? "$defs" : "definitions";
    return schema_violation(v, root.at(sec).at(r.substr(r.find('/', 2) + 1)), root, at);
  }
  if (s.contains("anyOf")) {
    for (const Json& b : s.at("anyOf").as_array())
      if (schema_violation(v, b, root, at).empty()) return "";
    return at + ": no anyOf branch matches";
  }
  if (s.contains("allOf"))
    for (const Json& b : s.at("allOf").as_array()) {
      const std::string e = schema_violation(v, b, root, at);
      if (!e.empty()) return e;
    }
  if (s.contains("const") && s.at("const").dump() != v.dump()) return at + ": not the const";
  if (s.contains("enum")) {
    bool hit = false;
    for (const Json& e : s.at("enum").as_array()) hit |= e.dump() == v.dump();
    if (!hit) return at + ": not in the enum";
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s.at("type").is_string())
      types.push_back(s.at("type").as_string());
    else
      for (const Json& t : s.at("type").as_array()) types.push_back(t.as_string());
    bool ok = false;
    for (const std::string& t : types) {
      const bool whole =
          v.type() == Json::Type::Int ||
          (v.type() == Json::Type::Float && std::floor(v.as_double()) == v.as_double());
      ok |= (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
            (t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
            (t == "integer" && whole) || (t == "boolean" && v.type() == Json::Type::Bool) ||
            (t == "null" && v.is_null());
    }
    if (!ok) return at + ": wrong type " + v.dump();
  }
  if (v.is_number()) {
    const double x = v.as_double();
    if (s.contains("minimum") && x < s.at("minimum").as_double()) return at + ": below minimum";
    if (s.contains("maximum") && x > s.at("maximum").as_double()) return at + ": above maximum";
    if (s.contains("exclusiveMinimum") && x <= s.at("exclusiveMinimum").as_double())
      return at + ": not above exclusiveMinimum";
    if (s.contains("exclusiveMaximum") && x >= s.at("exclusiveMaximum").as_double())
      return at + ": not below exclusiveMaximum";
  }
  if (v.is_string()) {
    const std::string& str = v.as_string();
    if (s.contains("minLength") && int64_t(code_points(str)) < s.at("minLength").as_int())
      return at + ": shorter than minLength";
    if (s.contains("maxLength") && int64_t(code_points(str)) > s.at("maxLength").as_int())
      return at + ": longer than maxLength";
    if (s.contains("pattern") && !std::regex_search(str, std::regex(s.at("pattern").as_string())))
      return at + ": does not match the pattern";
    if (s.contains("format")) {
      const std::string f = s.at("format").as_string();
      const char* rx = f == "date"   ? R"(\d{4}-\d\d-\d\d)"
                       : f == "uuid" ? R"([0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})"
                       : f == "date-time"
                           ? R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d))"
                           : ".*";
      if (!std::regex_match(str, std::regex(rx))) return at + ": not a " + f;
    }
  }
  if (v.is_array()) {
    const int64_t n = int64_t(v.size());
    if (s.contains("minItems") && n < s.at("minItems").as_int()) return at + ": too few items";
    if (s.contains("maxItems") && n > s.at("maxItems").as_int()) return at + ": too many items";
    if (s.contains("items"))
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string e = schema_violation(v.as_array()[i], s.at("items"), root,
                                               at + "[" + std::to_string(i) + "]");
        if (!e.empty()) return e;
      }
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const Json& r : s.at("required").as_array())
        if (!v.contains(r.as_string())) return at + ": missing " + r.as_string();
    const Json props = s.contains("properties") ? s.at("properties") : Json::object();
    for (const auto& [k, x] : v.as_object()) {
      if (props.contains(k)) {
        const std::string e = schema_violation(x, props.at(k), root, at + "." + k);
        if (!e.empty()) return e;
      } else if (s.contains("additionalProperties")) {
        const Json& ap = s.at("additionalProperties");
        const std::string e = schema_violation(x, ap, root, at + "." + k);
        if (!e.empty()) return at + ": additional property " + k + " (" + e + ")";
      }
    }
  }
  return "";
}

}  // namespace loom::test
