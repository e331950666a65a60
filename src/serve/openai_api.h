// The OpenAI HTTP API's request and response shapes (completions and chat completions), kept
// apart from the server so they are tested as plain data: parsing validates every field with an
// error naming it, and responses are built exactly as the API defines them so unmodified clients
// (the official openai packages) work.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/json.h"
#include "data/chat_tools.h"
#include "infer/engine_api.h"
#include "serve/structured_request.h"

namespace loom::serve {

// An error the API reports: {"error": {"message", "type", "param", "code"}} with this status.
struct ApiError {
  ApiError(int status_, std::string message_, std::string type_ = "invalid_request_error",
           std::string param_ = "", std::string code_ = "")
      : status(status_),
        message(std::move(message_)),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}
  int status;
  std::string message, type, param;
  std::string code;  // e.g. "model_not_found"
  Json body() const;
};

using ChatMessage = data::ChatTurn;

struct ApiRequest {
  bool chat = false;
  std::string model;
  std::vector<std::string> prompts;              // completions: strings
  std::vector<std::vector<int32_t>> prompt_ids;  // completions: token-id prompts
  std::vector<ChatMessage> messages;             // chat
  infer::SamplingParams sampling;
  StructuredRequest structured;   // output constraints and tools (structured_request.h)
  bool max_tokens_given = false;  // else the server picks it (the context left)
  bool stream = false, include_usage = false, echo = false;
};

// Parses and validates a request body; throws ApiError (400) naming the offending field.
ApiRequest parse_request(const std::string& body, bool chat, int default_max_tokens);

// One choice's result, accumulated from engine events.
struct ChoiceResult {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top;
  std::string finish_reason;
  infer::Usage usage;
  std::vector<data::ToolCall> tool_calls;  // read from the text (tool_calls.h); text the rest
};

struct ResponseContext {
  std::string id, model;
  int64_t created = 0;
  bool chat = false;
  int n = 1;  // choices per prompt (adjacent in a response)
  bool want_logprobs = false;
  std::function<std::string(int32_t)> token_text;
};

// The whole (non-streamed) response for choices in order.
Json completion_response(const ResponseContext& ctx, const std::vector<ChoiceResult>& choices);
// One streamed chunk for choice `index` with new text (and its tokens' logprobs), or its end.
Json stream_chunk(const ResponseContext& ctx, int index, const std::string& text,
                  const infer::TokenEvent* ev, const std::string& finish_reason, bool first);
// Usage of a response: completion tokens of every choice, prompt tokens once per prompt (its
// n choices share it).
infer::Usage total_usage(const std::vector<ChoiceResult>& choices, int n);
// The usage-only chunk of stream_options.include_usage (empty choices).
Json usage_chunk(const ResponseContext& ctx, const infer::Usage& total);
Json usage_json(const infer::Usage& u);

}  // namespace loom::serve
