#include "serve/structured_output.h"

#include "core/error.h"
#include "infer/constrain/json_schema.h"
#include "infer/constrain/regex_parser.h"
#include "serve/openai_api.h"

namespace loom::serve {

namespace cs = infer::constrain;

namespace {

std::shared_ptr<const cs::TokenVocabulary> vocabulary(const data::BpeTokenizer* tok) {
  std::vector<std::string> bytes;
  if (!tok) {
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  } else {
    for (int32_t i = 0; i < tok->vocab_size(); ++i)
      bytes.push_back(size_t(i) < tok->n_ordinary() ? tok->token_bytes(i) : std::string());
  }
  return std::make_shared<const cs::TokenVocabulary>(std::move(bytes));
}

// The calls tool_choice forces, in the template's format.
cs::Rx forced_calls(const StructuredRequest& s, const std::vector<cs::Rx>& params,
                    const std::string& template_name) {
  const std::string key = data::tool_arguments_key(template_name);
  std::vector<cs::Rx> one;
  for (size_t i = 0; i < s.tools.size(); ++i) {
    if (s.tool_choice == StructuredRequest::ToolChoice::Named && s.tools[i].name != s.tool_name)
      continue;
    std::string name;
    json_escape(name, s.tools[i].name);
    one.push_back(cs::rx_seq({cs::rx_literal("{\"name\": " + name + ", \"" + key + "\": "),
                              params[i], cs::rx_literal("}")}));
  }
  cs::Rx call = cs::rx_alt(std::move(one));
  if (template_name == "llama3") return call;  // Llama 3.1 makes one call per reply
  cs::Rx tagged = cs::rx_seq(
      {cs::rx_literal("<tool_call>\n"), std::move(call), cs::rx_literal("\n</tool_call>")});
  if (!s.parallel_tool_calls || s.tool_choice == StructuredRequest::ToolChoice::Named)
    return tagged;
  return cs::rx_seq({tagged, cs::rx_star(cs::rx_seq({cs::rx_literal("\n"), tagged}))});
}

}  // namespace

StructuredOutputs::StructuredOutputs(const data::BpeTokenizer* tok) : cache_(vocabulary(tok)) {}

std::shared_ptr<const cs::TokenConstraint> StructuredOutputs::constraint(
    const StructuredRequest& s, const std::string& template_name) {
  using K = StructuredRequest::Kind;
  std::vector<cs::Rx> params;
  for (size_t i = 0; i < s.tools.size(); ++i) {
    const std::string at = cat("tools[", i, "].function.parameters");
    try {
      params.push_back(cs::json_schema_rx(s.tools[i].parameters));
    } catch (const Error& e) {
      throw ApiError{400, cat("'", at, "' is not a JSON Schema Loom can hold: ", e.what()),
                     "invalid_request_error", at};
    }
  }
  std::string key;
  std::function<cs::Rx()> build;
  if (s.forces_call()) {
    Json tools = Json::array();
    for (const auto& t : s.tools) tools.push_back(Json(Json::Array{Json(t.name), t.parameters}));
    key = cat("tools\n", template_name, "\n", int(s.tool_choice), "\n", s.tool_name, "\n",
              s.parallel_tool_calls, "\n", tools.dump());
    build = [&] { return forced_calls(s, params, template_name); };
  } else if (s.kind == K::JsonObject) {
    key = "json_object";
    build = [] { return cs::json_object_rx(); };
  } else if (s.kind == K::JsonSchema) {
    key = "json_schema\n" + s.schema.dump();
    build = [&] { return cs::json_schema_rx(s.schema); };
  } else if (s.kind == K::Regex) {
    key = "regex\n" + s.regex;
    build = [&] { return cs::parse_regex(s.regex).rx; };  // the whole output matches anyway
  } else if (s.kind == K::Choice) {
    Json c = Json::array();
    for (const auto& x : s.choices) c.push_back(Json(x));
    key = "choice\n" + c.dump();
    build = [&] {
      std::vector<cs::Rx> alts;
      for (const auto& x : s.choices) alts.push_back(cs::rx_literal(x));
      return cs::rx_alt(std::move(alts));
    };
  } else {
    return nullptr;
  }
  const std::string field = s.forces_call() ? "tool_choice" : s.field;
  try {
    return cache_.get(key, build);
  } catch (const Error& e) {
    throw ApiError{400, cat("'", field, "' cannot be enforced: ", e.what()),
                   "invalid_request_error", field};
  }
}

}  // namespace loom::serve
