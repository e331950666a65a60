#include "serve/tool_calls.h"

#include "core/error.h"
#include "serve/openai_api.h"

namespace loom::serve {

namespace {

const std::string kOpen = "<tool_call>", kClose = "</tool_call>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string trim_right(std::string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

// A call's JSON if it is one: {"name": a tool's name, key: an object}.
bool read_call(const std::string& body, const std::string& key,
               const std::vector<data::ToolDef>& tools, data::ToolCall& out) {
  Json j;
  try {
    j = Json::parse(body, "tool call");
  } catch (const Error&) {
    return false;
  }
  if (!j.is_object() || !j.contains("name") || !j.at("name").is_string()) return false;
  const Json* args = j.contains(key)           ? &j.at(key)
                     : j.contains("arguments") ? &j.at("arguments")
                                               : nullptr;
  if (!args || !args->is_object()) return false;
  bool known = false;
  for (const auto& t : tools) known |= t.name == j.at("name").as_string();
  if (!known) return false;
  out.name = j.at("name").as_string();
  out.arguments = args->dump();
  return true;
}

}  // namespace

ParsedReply parse_tool_calls(const std::string& text, const std::string& template_name,
                             const std::vector<data::ToolDef>& tools, bool parallel,
                             const std::string& id_prefix) {
  ParsedReply r;
  const std::string key = data::tool_arguments_key(template_name);
  const size_t first = text.find(kOpen);
  if (first != std::string::npos) {
    size_t at = first;
    while (at != std::string::npos) {
      const size_t end = text.find(kClose, at);
      if (end == std::string::npos) break;
      data::ToolCall c;
      if (!read_call(text.substr(at + kOpen.size(), end - at - kOpen.size()), key, tools, c)) break;
      r.calls.push_back(std::move(c));
      if (!parallel) break;
      at = text.find(kOpen, end);
    }
    if (!r.calls.empty()) r.content = trim_right(text.substr(0, first));
  } else if (template_name == "llama3") {
    data::ToolCall c;
    if (read_call(text, key, tools, c)) r.calls.push_back(std::move(c));
  }
  if (r.calls.empty()) r.content = text;
  for (size_t i = 0; i < r.calls.size(); ++i) r.calls[i].id = cat(id_prefix, "_", i);
  return r;
}

ToolCallStream::ToolCallStream(std::string template_name, const std::vector<data::ToolDef>* tools,
                               bool parallel, bool forced, std::string id_prefix)
    : template_(std::move(template_name)),
      prefix_(std::move(id_prefix)),
      tools_(tools),
      parallel_(parallel),
      forced_(forced) {}

std::string ToolCallStream::feed(const std::string& text) {
  text_ += text;
  if (forced_ || holding_) return "";
  // Llama 3 writes a call as the whole reply: hold a reply that starts like a JSON object.
  if (template_ == "llama3") {
    const size_t nonspace = text_.find_first_not_of(" \n\t\r");
    if (nonspace == std::string::npos || text_[nonspace] == '{') return "";
  }
  size_t ready = text_.size();
  const size_t open = text_.find(kOpen, shown_);
  if (open != std::string::npos) {
    holding_ = true;
    ready = open;
  } else {  // hold a tail that may still become "<tool_call>"
    for (size_t k = std::min(kOpen.size() - 1, text_.size()); k > 0; --k)
      if (text_.compare(text_.size() - k, k, kOpen, 0, k) == 0) {
        ready = text_.size() - k;
        break;
      }
  }
  if (ready <= shown_) return "";
  std::string out = text_.substr(shown_, ready - shown_);
  shown_ = ready;
  return out;
}

ParsedReply ToolCallStream::finish() {
  ParsedReply r = parse_tool_calls(text_, template_, *tools_, parallel_, prefix_);
  r.content = r.content.size() > shown_ ? r.content.substr(shown_) : "";
  return r;
}

Json tool_calls_json(const std::vector<data::ToolCall>& calls, bool with_index) {
  Json a = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json f = Json::object();
    f["name"] = calls[i].name;
    f["arguments"] = calls[i].arguments;
    Json c = Json::object();
    if (with_index) c["index"] = int64_t(i);
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = f;
    a.push_back(c);
  }
  return a;
}

Json tool_calls_chunk(const ResponseContext& ctx, int index,
                      const std::vector<data::ToolCall>& calls) {
  Json j = stream_chunk(ctx, index, "", nullptr, "", false);
  j["choices"].as_array()[0]["delta"]["tool_calls"] = tool_calls_json(calls, true);
  return j;
}

}  // namespace loom::serve
