#include "serve/openai_api.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "serve/tool_calls.h"

namespace loom::serve {

Json ApiError::body() const {
  Json e = Json::object();
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? Json() : Json(param);
  e["code"] = code.empty() ? Json() : Json(code);
  Json j = Json::object();
  j["error"] = e;
  return j;
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError{400, message, "invalid_request_error", param};
}

double number(const Json& j, const std::string& key, double lo, double hi) {
  const Json& v = j.at(key);
  if (!v.is_number()) bad(key, "'" + key + "' must be a number");
  const double x = v.as_double();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(key, cat("'", key, "' must lie in [", lo, ", ", hi, "], got ", v.dump()));
  return x;
}

int64_t integer(const Json& j, const std::string& key, int64_t lo, int64_t hi) {
  const Json& v = j.at(key);
  if (v.type() != Json::Type::Int) bad(key, "'" + key + "' must be an integer");
  const int64_t x = v.as_int();
  if (x < lo || x > hi) bad(key, cat("'", key, "' must lie in [", lo, ", ", hi, "], got ", x));
  return x;
}

bool boolean(const Json& j, const std::string& key) {
  const Json& v = j.at(key);
  if (v.type() != Json::Type::Bool) bad(key, "'" + key + "' must be true or false");
  return v.as_bool();
}

bool given(const Json& j, const std::string& key) {
  return j.contains(key) && !j.at(key).is_null();
}

std::vector<int32_t> id_list(const Json& a, const std::string& param) {
  std::vector<int32_t> ids;
  for (const Json& t : a.as_array()) {
    if (t.type() != Json::Type::Int || t.as_int() < 0 || t.as_int() > INT32_MAX)
      bad(param, "'" + param + "' token ids must be non-negative integers");
    ids.push_back(static_cast<int32_t>(t.as_int()));
  }
  return ids;
}

// {"token id": bias}: ids as decimal strings, biases in [-100, 100] added to the logits.
std::vector<std::pair<int32_t, float>> logit_bias(const Json& m) {
  if (!m.is_object())
    bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [k, v] : m.as_object()) {
    char* end = nullptr;
    const long long id = std::strtoll(k.c_str(), &end, 10);
    if (k.empty() || *end != 0 || !(k[0] >= '0' && k[0] <= '9') || id < 0 || id > INT32_MAX)
      bad("logit_bias", cat("'logit_bias' key '", k, "' is not a token id"));
    if (!v.is_number() || !std::isfinite(v.as_double()) || v.as_double() < -100 ||
        v.as_double() > 100)
      bad("logit_bias",
          cat("'logit_bias' of token ", k, " must be a number in [-100, 100], got ", v.dump()));
    out.emplace_back(int32_t(id), float(v.as_double()));
  }
  if (out.size() > 1024) bad("logit_bias", "at most 1024 'logit_bias' entries");
  return out;
}

std::string content_text(const Json& c, const std::string& param) {
  if (c.is_string()) return c.as_string();
  if (c.is_null()) return "";
  if (!c.is_array()) bad(param, "'" + param + "' must be a string or an array of text parts");
  std::string s;
  for (const Json& part : c.as_array()) {
    if (!part.is_object() || !given(part, "type") || !part.at("type").is_string() ||
        part.at("type").as_string() != "text" || !given(part, "text") ||
        !part.at("text").is_string())
      bad(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    s += part.at("text").as_string();
  }
  return s;
}

}  // namespace

ApiRequest parse_request(const std::string& body, bool chat, int default_max_tokens) {
  Json j;
  try {
    j = Json::parse(body, "request body");
  } catch (const Error& e) {
    bad("", std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("", "the request body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  if (given(j, "model")) {
    if (!j.at("model").is_string()) bad("model", "'model' must be a string");
    r.model = j.at("model").as_string();
  }
  if (chat) {
    if (!given(j, "messages") || !j.at("messages").is_array() || j.at("messages").size() == 0)
      bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < j.at("messages").size(); ++i) {
      const Json& m = j.at("messages").as_array()[i];
      const std::string p = cat("messages[", i, "]");
      if (!m.is_object() || !given(m, "role") || !m.at("role").is_string())
        bad(p, "'" + p + "' must be an object with a string 'role'");
      const std::string role = m.at("role").as_string();
      if (role != "system" && role != "user" && role != "assistant" && role != "developer" &&
          role != "tool")
        bad(p + ".role", "unsupported role '" + role + "'");
      ChatMessage msg;
      msg.role = role == "developer" ? "system" : role;
      msg.content = content_text(m.contains("content") ? m.at("content") : Json(), p + ".content");
      parse_tool_fields(m, p, msg);
      r.messages.push_back(std::move(msg));
    }
  } else {
    if (!given(j, "prompt")) bad("prompt", "'prompt' is required");
    const Json& p = j.at("prompt");
    if (p.is_string()) {
      r.prompts.push_back(p.as_string());
    } else if (p.is_array() && p.size() > 0 && p.as_array()[0].is_string()) {
      for (const Json& s : p.as_array()) {
        if (!s.is_string()) bad("prompt", "'prompt' mixes strings and other values");
        r.prompts.push_back(s.as_string());
      }
    } else if (p.is_array() && p.size() > 0 && p.as_array()[0].is_array()) {
      for (const Json& a : p.as_array()) {
        if (!a.is_array()) bad("prompt", "'prompt' mixes token lists and other values");
        r.prompt_ids.push_back(id_list(a, "prompt"));
      }
    } else if (p.is_array() && p.size() > 0) {
      r.prompt_ids.push_back(id_list(p, "prompt"));
    } else {
      bad("prompt", "'prompt' must be a string, an array of strings or of token ids");
    }
    if (r.prompts.size() + r.prompt_ids.size() > 64) bad("prompt", "at most 64 prompts");
  }
  infer::SamplingParams& s = r.sampling;
  s.max_tokens = default_max_tokens;
  if (given(j, "max_tokens")) s.max_tokens = int(integer(j, "max_tokens", 0, 1 << 20));
  if (given(j, "max_completion_tokens"))
    s.max_tokens = int(integer(j, "max_completion_tokens", 0, 1 << 20));
  r.max_tokens_given = given(j, "max_tokens") || given(j, "max_completion_tokens");
  // Fields Loom does not honour are refused rather than silently dropped.
  for (const char* k : {"functions", "function_call", "guided_grammar", "suffix", "prediction"})
    if (given(j, k)) bad(k, cat("'", k, "' is not supported by this server"));
  if (given(j, "logit_bias")) s.logit_bias = logit_bias(j.at("logit_bias"));
  if (given(j, "temperature")) s.temperature = float(number(j, "temperature", 0, 2));
  if (given(j, "top_p")) s.top_p = float(number(j, "top_p", 1e-9, 1));
  if (given(j, "top_k")) {
    const int64_t k = integer(j, "top_k", -1, 1 << 20);
    s.top_k = k < 0 ? 0 : int(k);
  }
  if (given(j, "min_p")) s.min_p = float(number(j, "min_p", 0, 1));
  if (given(j, "presence_penalty"))
    s.presence_penalty = float(number(j, "presence_penalty", -2, 2));
  if (given(j, "frequency_penalty"))
    s.frequency_penalty = float(number(j, "frequency_penalty", -2, 2));
  if (given(j, "repetition_penalty"))
    s.repetition_penalty = float(number(j, "repetition_penalty", 1e-3, 10));
  if (given(j, "n")) s.n = int(integer(j, "n", 1, 16));
  if (given(j, "best_of") && integer(j, "best_of", 1, 16) != s.n)
    bad("best_of", "'best_of' other than 'n' is not supported");
  if (given(j, "seed")) s.seed = static_cast<uint64_t>(integer(j, "seed", INT64_MIN, INT64_MAX));
  if (given(j, "ignore_eos")) s.ignore_eos = boolean(j, "ignore_eos");
  if (given(j, "stop")) {
    const Json& st = j.at("stop");
    if (st.is_string()) {
      s.stop.push_back(st.as_string());
    } else if (st.is_array()) {
      for (const Json& x : st.as_array()) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        s.stop.push_back(x.as_string());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
    if (s.stop.size() > 16) bad("stop", "at most 16 stop strings");
    for (const auto& x : s.stop)
      if (x.empty()) bad("stop", "stop strings must not be empty");
  }
  if (given(j, "stop_token_ids")) {
    if (!j.at("stop_token_ids").is_array()) bad("stop_token_ids", "must be an array of ids");
    s.stop_token_ids = id_list(j.at("stop_token_ids"), "stop_token_ids");
  }
  if (chat) {
    if (given(j, "logprobs") && boolean(j, "logprobs"))
      s.logprobs = given(j, "top_logprobs") ? int(integer(j, "top_logprobs", 0, 20)) : 0;
  } else if (given(j, "logprobs")) {
    s.logprobs = int(integer(j, "logprobs", 0, 20));
  }
  r.structured = parse_structured(j, chat);
  if (given(j, "stream")) r.stream = boolean(j, "stream");
  if (given(j, "echo")) r.echo = boolean(j, "echo");
  if (given(j, "stream_options")) {
    const Json& so = j.at("stream_options");
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (given(so, "include_usage")) r.include_usage = boolean(so, "include_usage");
  }
  return r;
}

Json usage_json(const infer::Usage& u) {
  Json j = Json::object();
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  Json d = Json::object();
  d["cached_tokens"] = u.cached_prompt_tokens;
  j["prompt_tokens_details"] = d;
  // Speculative guesses, under OpenAI's predicted-output names (only when guesses were made).
  if (u.accepted_draft_tokens + u.rejected_draft_tokens > 0) {
    Json c = Json::object();
    c["accepted_prediction_tokens"] = u.accepted_draft_tokens;
    c["rejected_prediction_tokens"] = u.rejected_draft_tokens;
    j["completion_tokens_details"] = c;
  }
  return j;
}

namespace {

Json envelope(const ResponseContext& ctx, bool chunk) {
  Json j = Json::object();
  j["id"] = ctx.id;
  j["object"] =
      ctx.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  j["created"] = ctx.created;
  j["model"] = ctx.model;
  j["system_fingerprint"] = Json();
  return j;
}

Json bytes_of(const std::string& s) {
  Json a = Json::array();
  for (unsigned char c : s) a.push_back(int64_t(c));
  return a;
}

// Logprobs of tokens, in the shape of a completion (parallel arrays) or a chat (per-token
// objects), for the tokens [from, to) of a choice.
Json logprobs_json(const ResponseContext& ctx, const std::vector<int32_t>& tokens,
                   const std::vector<float>& lps,
                   const std::vector<std::vector<std::pair<int32_t, float>>>& top) {
  if (ctx.chat) {
    Json content = Json::array();
    for (size_t i = 0; i < tokens.size() && i < lps.size(); ++i) {
      const std::string t = ctx.token_text(tokens[i]);
      Json e = Json::object();
      e["token"] = t;
      e["logprob"] = double(lps[i]);
      e["bytes"] = bytes_of(t);
      Json alts = Json::array();
      for (auto [id, lp] : top[i]) {
        Json a = Json::object();
        const std::string at = ctx.token_text(id);
        a["token"] = at;
        a["logprob"] = double(lp);
        a["bytes"] = bytes_of(at);
        alts.push_back(a);
      }
      e["top_logprobs"] = alts;
      content.push_back(e);
    }
    Json j = Json::object();
    j["content"] = content;
    j["refusal"] = Json();
    return j;
  }
  Json toks = Json::array(), tl = Json::array(), tops = Json::array(), offs = Json::array();
  int64_t off = 0;
  for (size_t i = 0; i < tokens.size() && i < lps.size(); ++i) {
    const std::string t = ctx.token_text(tokens[i]);
    toks.push_back(t);
    tl.push_back(double(lps[i]));
    Json m = Json::object();
    for (auto [id, lp] : top[i]) m[ctx.token_text(id)] = double(lp);
    tops.push_back(m);
    offs.push_back(off);
    off += int64_t(t.size());
  }
  Json j = Json::object();
  j["tokens"] = toks;
  j["token_logprobs"] = tl;
  j["top_logprobs"] = tops;
  j["text_offset"] = offs;
  return j;
}

}  // namespace

Json completion_response(const ResponseContext& ctx, const std::vector<ChoiceResult>& choices) {
  Json j = envelope(ctx, false);
  Json cs = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    Json ch = Json::object();
    ch["index"] = int64_t(i);
    if (ctx.chat) {
      Json m = Json::object();
      m["role"] = "assistant";
      m["content"] = c.text.empty() && !c.tool_calls.empty() ? Json() : Json(c.text);
      m["refusal"] = Json();
      if (!c.tool_calls.empty()) m["tool_calls"] = tool_calls_json(c.tool_calls, false);
      ch["message"] = m;
    } else {
      ch["text"] = c.text;
    }
    ch["logprobs"] = ctx.want_logprobs ? logprobs_json(ctx, c.tokens, c.logprobs, c.top) : Json();
    ch["finish_reason"] = c.finish_reason == "abort" ? Json() : Json(c.finish_reason);
    cs.push_back(ch);
  }
  j["choices"] = cs;
  j["usage"] = usage_json(total_usage(choices, ctx.n));
  return j;
}

infer::Usage total_usage(const std::vector<ChoiceResult>& choices, int n) {
  infer::Usage total;
  for (size_t i = 0; i < choices.size(); ++i) {
    total.completion_tokens += choices[i].usage.completion_tokens;
    total.accepted_draft_tokens += choices[i].usage.accepted_draft_tokens;
    total.rejected_draft_tokens += choices[i].usage.rejected_draft_tokens;
    // Completions of one prompt share it: its tokens count once per prompt, as OpenAI does.
    if (i % size_t(n) == 0) {
      total.prompt_tokens += choices[i].usage.prompt_tokens;
      total.cached_prompt_tokens += choices[i].usage.cached_prompt_tokens;
    }
  }
  return total;
}

Json stream_chunk(const ResponseContext& ctx, int index, const std::string& text,
                  const infer::TokenEvent* ev, const std::string& finish_reason, bool first) {
  Json j = envelope(ctx, true);
  Json ch = Json::object();
  ch["index"] = index;
  if (ctx.chat) {
    Json d = Json::object();
    if (first) d["role"] = "assistant";
    if (!text.empty() || first) d["content"] = text;
    ch["delta"] = d;
  } else {
    ch["text"] = text;
  }
  ch["logprobs"] = ctx.want_logprobs && ev && !ev->tokens.empty()
                       ? logprobs_json(ctx, ev->tokens, ev->logprobs, ev->top_logprobs)
                       : Json();
  ch["finish_reason"] =
      finish_reason.empty() || finish_reason == "abort" ? Json() : Json(finish_reason);
  Json cs = Json::array();
  cs.push_back(ch);
  j["choices"] = cs;
  return j;
}

Json usage_chunk(const ResponseContext& ctx, const infer::Usage& total) {
  Json j = envelope(ctx, true);
  j["choices"] = Json::array();
  j["usage"] = usage_json(total);
  return j;
}

}  // namespace loom::serve
