// Tool calls read from a model's text, in OpenAI's response shapes. The model writes a call in
// its template's format (data/chat_tools.h): <tool_call>{"name": ..., "arguments": {...}}
// </tool_call> blocks (Hermes / Qwen), or for Llama 3 a reply that is one JSON object
// {"name": ..., "parameters": {...}}. A call must name one of the request's tools and give an
// object of arguments; text that is not such a call stays content.
#pragma once

#include <string>
#include <vector>

#include "core/json.h"
#include "data/chat_tools.h"

namespace loom::serve {

struct ParsedReply {
  std::string content;  // the text before the first call (all of it without calls)
  std::vector<data::ToolCall> calls;
};

// `ids` gives each call's id (call_<...>). At most one call unless `parallel`.
ParsedReply parse_tool_calls(const std::string& text, const std::string& template_name,
                             const std::vector<data::ToolDef>& tools, bool parallel,
                             const std::string& id_prefix);

// A choice's text as it streams: content is passed on until a call may have begun; from there
// the text is held, and parsed when the choice ends.
class ToolCallStream {
 public:
  ToolCallStream(std::string template_name, const std::vector<data::ToolDef>* tools, bool parallel,
                 bool forced, std::string id_prefix);
  // New text: the part that can be shown as content now.
  std::string feed(const std::string& text);
  // At the end: the content held back that is still to be shown, and the calls.
  ParsedReply finish();

 private:
  std::string template_, prefix_;
  const std::vector<data::ToolDef>* tools_;
  bool parallel_, forced_;
  std::string text_;
  size_t shown_ = 0;
  bool holding_ = false;
};

// OpenAI's message.tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}];
// with `with_index`, each also carries its "index" (a streamed delta's shape).
Json tool_calls_json(const std::vector<data::ToolCall>& calls, bool with_index);

struct ResponseContext;
// A streamed chunk whose delta carries choice `index`'s calls whole.
Json tool_calls_chunk(const ResponseContext& ctx, int index,
                      const std::vector<data::ToolCall>& calls);

}  // namespace loom::serve
