#include "data/chat_tools.h"

#include "core/error.h"

namespace loom::data {

namespace {

std::string tool_json(const ToolDef& t) {
  Json f = Json::object();
  f["name"] = t.name;
  if (!t.description.empty()) f["description"] = t.description;
  f["parameters"] = t.parameters;
  Json j = Json::object();
  j["type"] = "function";
  j["function"] = f;
  return j.dump();
}

std::vector<ChatMessage> chatml(const std::vector<ChatTurn>& turns,
                                const std::vector<ToolDef>& tools) {
  std::vector<ChatMessage> out;
  size_t first = 0;
  if (!tools.empty()) {
    std::string sys;
    if (!turns.empty() && turns[0].role == "system") {
      sys = turns[0].content + "\n\n";
      first = 1;
    }
    sys +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ToolDef& t : tools) {
      sys += '\n';
      sys += tool_json(t);
    }
    sys +=
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
    out.push_back({"system", sys});
  }
  for (size_t i = first; i < turns.size(); ++i) {
    const ChatTurn& t = turns[i];
    if (t.role == "tool") {  // consecutive results share one user turn
      std::string text = "<tool_response>\n" + t.content + "\n</tool_response>";
      if (i > first && turns[i - 1].role == "tool") {
        out.back().content += '\n';
        out.back().content += text;
      } else {
        out.push_back({"user", text});
      }
      continue;
    }
    std::string text = t.content;
    for (size_t k = 0; k < t.tool_calls.size(); ++k) {
      if (!text.empty()) text += '\n';
      text += "<tool_call>\n";
      text += tool_call_json("chatml", t.tool_calls[k]);
      text += "\n</tool_call>";
    }
    out.push_back({t.role, text});
  }
  return out;
}

std::vector<ChatMessage> llama3(const std::vector<ChatTurn>& turns,
                                const std::vector<ToolDef>& tools) {
  std::vector<ChatMessage> out;
  bool tools_written = tools.empty();
  for (const ChatTurn& t : turns) {
    if (t.role == "tool") {
      out.push_back({"ipython", t.content});
      continue;
    }
    std::string text = t.content;
    if (t.role == "user" && !tools_written) {
      std::string head =
          "Given the following functions, please respond with a JSON for a function call with "
          "its proper arguments that best answers the given prompt.\n\nRespond in the format "
          "{\"name\": function name, \"parameters\": dictionary of argument name and its "
          "value}.Do not use variables.\n\n";
      for (const ToolDef& d : tools) head += tool_json(d) + "\n\n";
      text = head + text;
      tools_written = true;
    }
    for (const ToolCall& c : t.tool_calls) text += tool_call_json("llama3", c);
    out.push_back({t.role, text});
  }
  return out;
}

}  // namespace

std::string tool_call_json(const std::string& template_name, const ToolCall& call) {
  std::string name;
  json_escape(name, call.name);
  return "{\"name\": " + name + ", \"" + tool_arguments_key(template_name) +
         "\": " + call.arguments + "}";
}

std::vector<ChatMessage> tool_conversation(const std::string& template_name,
                                           const std::vector<ChatTurn>& turns,
                                           const std::vector<ToolDef>& tools) {
  return template_name == "llama3" ? llama3(turns, tools) : chatml(turns, tools);
}

}  // namespace loom::data
