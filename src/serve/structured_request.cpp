#include "serve/structured_request.h"

#include <set>

#include "core/error.h"
#include "serve/openai_api.h"

namespace loom::serve {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError{400, message, "invalid_request_error", param};
}

bool given(const Json& j, const std::string& key) {
  return j.contains(key) && !j.at(key).is_null();
}

void only_keys(const Json& j, const std::string& at, const std::set<std::string>& known) {
  for (const auto& [k, v] : j.as_object())
    if (!known.count(k)) bad(at + "." + k, "unknown field '" + at + "." + k + "'");
}

const std::string& text(const Json& j, const std::string& key, const std::string& at) {
  if (!given(j, key) || !j.at(key).is_string()) bad(at, "'" + at + "' must be a string");
  return j.at(key).as_string();
}

// A schema given as an object, or as a JSON text (vLLM takes both).
Json schema_value(const Json& v, const std::string& at) {
  if (v.is_object() || v.type() == Json::Type::Bool) return v;
  if (v.is_string()) {
    try {
      return Json::parse(v.as_string(), at);
    } catch (const Error& e) {
      bad(at, "'" + at + "' is not valid JSON: " + e.what());
    }
  }
  bad(at, "'" + at + "' must be a JSON Schema (an object)");
}

std::vector<std::string> choice_list(const Json& v, const std::string& at) {
  if (!v.is_array() || v.size() == 0) bad(at, "'" + at + "' must be a non-empty array of strings");
  std::vector<std::string> out;
  for (const Json& c : v.as_array()) {
    if (!c.is_string()) bad(at, "'" + at + "' must be a non-empty array of strings");
    out.push_back(c.as_string());
  }
  return out;
}

void set_kind(StructuredRequest& s, StructuredRequest::Kind k, const std::string& field) {
  if (s.kind != StructuredRequest::Kind::None)
    bad(field, "'" + field + "' and '" + s.field + "' both constrain the output; give one");
  s.kind = k;
  s.field = field;
}

void response_format(const Json& rf, StructuredRequest& s) {
  if (!rf.is_object()) bad("response_format", "'response_format' must be an object");
  const std::string& type = text(rf, "type", "response_format.type");
  if (type == "text") {
    only_keys(rf, "response_format", {"type"});
  } else if (type == "json_object") {
    only_keys(rf, "response_format", {"type"});
    set_kind(s, StructuredRequest::Kind::JsonObject, "response_format");
  } else if (type == "json_schema") {
    only_keys(rf, "response_format", {"type", "json_schema"});
    if (!given(rf, "json_schema") || !rf.at("json_schema").is_object())
      bad("response_format.json_schema", "'response_format.json_schema' must be an object");
    const Json& js = rf.at("json_schema");
    only_keys(js, "response_format.json_schema", {"name", "schema", "strict", "description"});
    if (given(js, "name")) text(js, "name", "response_format.json_schema.name");
    if (given(js, "strict") && js.at("strict").type() != Json::Type::Bool)
      bad("response_format.json_schema.strict", "'strict' must be true or false");
    if (!given(js, "schema"))
      bad("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
    set_kind(s, StructuredRequest::Kind::JsonSchema, "response_format");
    s.schema = schema_value(js.at("schema"), "response_format.json_schema.schema");
  } else {
    bad("response_format.type", "'response_format.type' must be text, json_object or json_schema");
  }
}

void structured_outputs(const Json& so, StructuredRequest& s) {
  if (!so.is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
  for (const auto& [k, v] : so.as_object()) {
    if (v.is_null()) continue;
    const std::string at = "structured_outputs." + k;
    if (k == "json") {
      set_kind(s, StructuredRequest::Kind::JsonSchema, at);
      s.schema = schema_value(v, at);
    } else if (k == "json_object") {
      if (v.type() != Json::Type::Bool) bad(at, "'" + at + "' must be true or false");
      if (v.as_bool()) set_kind(s, StructuredRequest::Kind::JsonObject, at);
    } else if (k == "regex") {
      if (!v.is_string()) bad(at, "'" + at + "' must be a string");
      set_kind(s, StructuredRequest::Kind::Regex, at);
      s.regex = v.as_string();
    } else if (k == "choice") {
      set_kind(s, StructuredRequest::Kind::Choice, at);
      s.choices = choice_list(v, at);
    } else if (k == "grammar") {
      bad(at, "'" + at + "' (a context-free grammar) is not supported: use json, regex or choice");
    } else {
      bad(at, "unknown field '" + at + "'");
    }
  }
}

void tools(const Json& j, StructuredRequest& s) {
  const Json& ts = j.at("tools");
  if (!ts.is_array()) bad("tools", "'tools' must be an array");
  std::set<std::string> names;
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string at = cat("tools[", i, "]");
    const Json& t = ts.as_array()[i];
    if (!t.is_object()) bad(at, "'" + at + "' must be an object");
    only_keys(t, at, {"type", "function"});
    if (text(t, "type", at + ".type") != "function")
      bad(at + ".type", "'" + at + ".type' must be \"function\"");
    if (!given(t, "function") || !t.at("function").is_object())
      bad(at + ".function", "'" + at + ".function' must be an object");
    const Json& f = t.at("function");
    only_keys(f, at + ".function", {"name", "description", "parameters", "strict"});
    data::ToolDef d;
    d.name = text(f, "name", at + ".function.name");
    if (d.name.empty() || d.name.size() > 64 ||
        d.name.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
            std::string::npos)
      bad(at + ".function.name", "'" + at + ".function.name' must be 1 to 64 of a-z A-Z 0-9 _ -");
    if (!names.insert(d.name).second)
      bad(at + ".function.name", "two tools are named '" + d.name + "'");
    if (given(f, "description"))
      d.description = text(f, "description", at + ".function.description");
    if (given(f, "strict") && f.at("strict").type() != Json::Type::Bool)
      bad(at + ".function.strict", "'strict' must be true or false");
    if (given(f, "parameters")) {
      d.parameters = f.at("parameters");
      if (!d.parameters.is_object())
        bad(at + ".function.parameters",
            "'" + at + ".function.parameters' must be a JSON Schema object");
    } else {
      d.parameters = Json::parse(R"({"type": "object", "properties": {}})");
    }
    s.tools.push_back(std::move(d));
  }
}

void tool_choice(const Json& tc, StructuredRequest& s) {
  using TC = StructuredRequest::ToolChoice;
  if (tc.is_string()) {
    const std::string& v = tc.as_string();
    if (v == "none")
      s.tool_choice = TC::None;
    else if (v == "auto")
      s.tool_choice = TC::Auto;
    else if (v == "required")
      s.tool_choice = TC::Required;
    else
      bad("tool_choice", "'tool_choice' must be none, auto, required or a named function");
  } else if (tc.is_object()) {
    only_keys(tc, "tool_choice", {"type", "function"});
    if (text(tc, "type", "tool_choice.type") != "function")
      bad("tool_choice.type", "'tool_choice.type' must be \"function\"");
    if (!given(tc, "function") || !tc.at("function").is_object())
      bad("tool_choice.function", "'tool_choice.function' must be an object");
    only_keys(tc.at("function"), "tool_choice.function", {"name"});
    s.tool_choice = TC::Named;
    s.tool_name = text(tc.at("function"), "name", "tool_choice.function.name");
  } else {
    bad("tool_choice", "'tool_choice' must be a string or an object");
  }
}

}  // namespace

StructuredRequest parse_structured(const Json& j, bool chat) {
  StructuredRequest s;
  if (given(j, "response_format")) response_format(j.at("response_format"), s);
  if (given(j, "structured_outputs")) structured_outputs(j.at("structured_outputs"), s);
  if (given(j, "guided_json")) {
    set_kind(s, StructuredRequest::Kind::JsonSchema, "guided_json");
    s.schema = schema_value(j.at("guided_json"), "guided_json");
  }
  if (given(j, "guided_regex")) {
    if (!j.at("guided_regex").is_string()) bad("guided_regex", "'guided_regex' must be a string");
    set_kind(s, StructuredRequest::Kind::Regex, "guided_regex");
    s.regex = j.at("guided_regex").as_string();
  }
  if (given(j, "guided_choice")) {
    set_kind(s, StructuredRequest::Kind::Choice, "guided_choice");
    s.choices = choice_list(j.at("guided_choice"), "guided_choice");
  }
  for (const char* k :
       {"guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern", "structural_tag"})
    if (given(j, k)) bad(k, cat("'", k, "' is not supported"));
  const bool has_tools = given(j, "tools");
  if (has_tools && !chat) bad("tools", "'tools' is for chat completions");
  if (given(j, "tool_choice") && !chat) bad("tool_choice", "'tool_choice' is for chat completions");
  if (has_tools) tools(j, s);
  if (given(j, "tool_choice")) {
    tool_choice(j.at("tool_choice"), s);
    if (s.tools.empty() && s.tool_choice != StructuredRequest::ToolChoice::None)
      bad("tool_choice", "'tool_choice' needs 'tools'");
    if (s.tool_choice == StructuredRequest::ToolChoice::Named) {
      bool found = false;
      for (const auto& t : s.tools) found |= t.name == s.tool_name;
      if (!found) bad("tool_choice.function.name", "no tool is named '" + s.tool_name + "'");
    }
  }
  if (given(j, "parallel_tool_calls")) {
    if (j.at("parallel_tool_calls").type() != Json::Type::Bool)
      bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    s.parallel_tool_calls = j.at("parallel_tool_calls").as_bool();
  }
  if (given(j, "ignore_eos") && j.at("ignore_eos").type() == Json::Type::Bool &&
      j.at("ignore_eos").as_bool() && (s.kind != StructuredRequest::Kind::None || s.forces_call()))
    bad("ignore_eos",
        "'ignore_eos' cannot be combined with a constrained output (it ends when "
        "the output is complete)");
  if (s.forces_call() && s.kind != StructuredRequest::Kind::None)
    bad(s.field,
        "'" + s.field + "' and a tool_choice that forces a call both constrain the output");
  return s;
}

void parse_tool_fields(const Json& m, const std::string& at, data::ChatTurn& out) {
  if (out.role == "tool") {
    if (!given(m, "tool_call_id") || !m.at("tool_call_id").is_string())
      bad(at + ".tool_call_id", "a tool message needs a string 'tool_call_id'");
    out.tool_call_id = m.at("tool_call_id").as_string();
  }
  if (!given(m, "tool_calls")) return;
  if (out.role != "assistant") bad(at + ".tool_calls", "only assistant messages have 'tool_calls'");
  const Json& calls = m.at("tool_calls");
  if (!calls.is_array()) bad(at + ".tool_calls", "'" + at + ".tool_calls' must be an array");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string p = cat(at, ".tool_calls[", i, "]");
    const Json& c = calls.as_array()[i];
    if (!c.is_object() || !given(c, "function") || !c.at("function").is_object())
      bad(p, "'" + p + "' must be an object with a 'function'");
    if (given(c, "type") && (!c.at("type").is_string() || c.at("type").as_string() != "function"))
      bad(p + ".type", "'" + p + ".type' must be \"function\"");
    data::ToolCall tc;
    if (given(c, "id")) tc.id = text(c, "id", p + ".id");
    tc.name = text(c.at("function"), "name", p + ".function.name");
    const std::string& args = text(c.at("function"), "arguments", p + ".function.arguments");
    Json a;
    try {
      a = Json::parse(args, p + ".function.arguments");
    } catch (const Error& e) {
      bad(p + ".function.arguments",
          "'" + p + ".function.arguments' is not valid JSON: " + e.what());
    }
    if (!a.is_object())
      bad(p + ".function.arguments", "'" + p + ".function.arguments' must be a JSON object");
    tc.arguments = a.dump();
    out.tool_calls.push_back(std::move(tc));
  }
}

}  // namespace loom::serve
