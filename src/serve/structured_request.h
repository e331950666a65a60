// The request fields of structured outputs and tool calling, read and checked (every value
// honoured or refused with a 400 naming the field):
//   response_format     {"type": "text" | "json_object"} or {"type": "json_schema",
//                       "json_schema": {"name", "schema", "strict", "description"}}
//   structured_outputs  vLLM's {"json": schema | "regex": pattern | "choice": [strings]}
//   guided_json, guided_regex, guided_choice   vLLM's older names of the same
//   tools               [{"type": "function", "function": {"name", "description",
//                       "parameters", "strict"}}] (chat only)
//   tool_choice         "none" | "auto" | "required" | {"type": "function", "function":
//                       {"name"}}; parallel_tool_calls  true | false
// At most one output constraint may be given; a tool choice that forces a call is one.
#pragma once

#include <string>
#include <vector>

#include "core/json.h"
#include "data/chat_tools.h"

namespace loom::serve {

struct StructuredRequest {
  enum class Kind { None, JsonObject, JsonSchema, Regex, Choice };
  Kind kind = Kind::None;
  std::string field;  // the request field the constraint came from (named in errors)
  Json schema;        // JsonSchema
  std::string regex;  // Regex
  std::vector<std::string> choices;

  std::vector<data::ToolDef> tools;
  enum class ToolChoice { None, Auto, Required, Named };
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_name;  // Named
  bool parallel_tool_calls = true;
  // Tools are offered to the model (rendered in the prompt, calls parsed from its output).
  bool uses_tools() const { return !tools.empty() && tool_choice != ToolChoice::None; }
  bool forces_call() const {
    return uses_tools() &&
           (tool_choice == ToolChoice::Required || tool_choice == ToolChoice::Named);
  }
};

// Reads the fields above from a request body (an object); throws ApiError (400).
StructuredRequest parse_structured(const Json& body, bool chat);
// The tool fields of chat message `at` (messages[i]): an assistant's tool_calls, a tool
// result's tool_call_id. Throws ApiError (400).
void parse_tool_fields(const Json& message, const std::string& at, data::ChatTurn& out);

}  // namespace loom::serve
