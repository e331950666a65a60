// Tool calling in chat prompts: a conversation with tool definitions, assistant turns that
// call tools and tool results, written as the plain turns a chat template renders, in the
// format of the template's family:
//   chatml  Hermes / Qwen 2.5: the tools as JSON inside <tools></tools> in the system turn, a
//           call as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> in the
//           assistant's text, results as <tool_response>...</tool_response> in a user turn
//   llama3  Llama 3.1's JSON tool calling: the tools and the answer format in the first user
//           turn, a call as {"name": ..., "parameters": {...}}, results in an "ipython" turn
#pragma once

#include <string>
#include <vector>

#include "core/json.h"
#include "data/chat.h"

namespace loom::data {

struct ToolCall {
  std::string id, name;
  std::string arguments;  // a JSON object's text
};

struct ToolDef {
  std::string name, description;
  Json parameters;  // JSON Schema of the arguments (an object schema)
};

// A chat turn as an API request holds it: system | user | assistant | tool.
struct ChatTurn {
  std::string role, content;
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool
};

// The conversation as plain turns for `template_name` ("chatml", "llama3"; another name is
// written as chatml). With no tools and no tool turns, the turns unchanged.
std::vector<ChatMessage> tool_conversation(const std::string& template_name,
                                           const std::vector<ChatTurn>& turns,
                                           const std::vector<ToolDef>& tools);

// The key that holds a call's arguments in the family's format: "arguments" or "parameters".
inline std::string tool_arguments_key(const std::string& template_name) {
  return template_name == "llama3" ? "parameters" : "arguments";
}
// One call as the family writes it (without the chatml tags).
std::string tool_call_json(const std::string& template_name, const ToolCall& call);

}  // namespace loom::data
