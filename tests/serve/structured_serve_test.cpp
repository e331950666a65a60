// Structured outputs and tool calls through `loom serve`'s HTTP API (loopback, the real engine,
// a tiny byte-level chat model): response_format, vLLM's structured_outputs and guided_* names,
// tools with tool_choice required / named / auto / none, tool turns in the history, streamed
// tool-call deltas; and the 400s that name the field, the schema keyword or the regex feature.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <regex>
#include <thread>

#include "core/json.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "infer/json_schema_check.h"
#include "infer/model_runner.h"
#include "model/decoder.h"
#include "serve/server.h"
#include "serve/tool_calls.h"

using namespace loom;

namespace {

struct Structured : testing::Test {
  data::BpeTokenizer tok = data::byte_chatml_tokenizer();
  std::unique_ptr<data::ChatTemplate> chat;
  std::unique_ptr<Decoder> model;
  std::unique_ptr<infer::DecoderRunner> runner;
  std::unique_ptr<infer::LoomEngine> engine;
  std::unique_ptr<serve::Server> server;
  std::thread http;
  int port = 0;

  void SetUp() override {
    ModelConfig c = model_preset("tiny-llama");
    c.n_layer = 2, c.d_model = 32, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 8, c.d_ff = 64;
    c.vocab = 260, c.max_seq = 2048, c.init_std = 0.3f;
    model = std::make_unique<Decoder>(c, cpu_backend());
    model->params().init(1);
    chat = std::make_unique<data::ChatTemplate>("chatml", tok);
    runner = std::make_unique<infer::DecoderRunner>(*model);
    infer::EngineConfig ec;
    ec.eos_ids = {tok.special_id("<|endoftext|>"), tok.special_id("<|im_end|>")};
    ec.detokenize = [this](const std::vector<int32_t>& ids) {
      std::string s;
      for (int32_t t : ids)
        if (t < tok.vocab_size()) tok.decode_append(t, s);
      return s;
    };
    engine = std::make_unique<infer::LoomEngine>(*runner, ec);
    engine->start();
    serve::ServerOptions so;
    so.port = 0;
    so.model_name = "tiny";
    so.max_seq = c.max_seq;
    server = std::make_unique<serve::Server>(*engine, &tok, chat.get(), so);
    port = server->bind();
    http = std::thread([this] { server->run(); });
    server->set_ready(true);
    // Listening before any test body runs: a stop() that came before the listen loop started
    // would not end it.
    httplib::Client health("127.0.0.1", port);
    for (int i = 0; i < 200 && !health.Get("/health"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  void TearDown() override {
    engine->stop(0);
    server->stop();
    http.join();
  }
  std::pair<int, Json> post(const std::string& path, const std::string& body,
                            std::string* raw = nullptr) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return {0, Json()};
    if (raw) *raw = r->body;
    return {r->status, r->body.rfind("data: ", 0) == 0 ? Json() : Json::parse(r->body)};
  }
  // A 400 whose message holds `what` and whose param is `param`.
  void expect_400(const std::string& path, const std::string& body, const std::string& what,
                  const std::string& param) {
    auto [status, j] = post(path, body);
    EXPECT_EQ(status, 400) << body << " -> " << j.dump();
    if (status != 400) return;
    const Json& e = j.at("error");
    EXPECT_NE(e.at("message").as_string().find(what), std::string::npos) << e.dump();
    EXPECT_EQ(e.at("param").is_null() ? "" : e.at("param").as_string(), param) << e.dump();
  }
};

const char* kWeather = R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Weather of a city", "parameters": {"type": "object",
  "properties": {"city": {"type": "string", "maxLength": 8},
                 "unit": {"enum": ["celsius", "fahrenheit"]}},
  "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
  "properties": {"zone": {"type": "string", "format": "date"}}, "required": ["zone"]}}}])";

std::string chat_body(const std::string& extra) {
  return R"({"messages": [{"role": "user", "content": "weather in Oslo?"}], "max_tokens": 300,
             "temperature": 1.5, "seed": 3, "n": 3, )" +
         extra + "}";
}

}  // namespace

TEST_F(Structured, ResponseFormatsAndVllmConstraintsHold) {
  const std::string schema =
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
          "n": {"type": "integer", "minimum": 1, "maximum": 99},
          "xs": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
          "required": ["name", "n", "xs"], "additionalProperties": false})";
  const Json s = Json::parse(schema);
  for (
      const std::string& rf :
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "t", "strict": true, "schema": )" +
           schema + "}}",
       R"("structured_outputs": {"json": )" + schema + "}",
       R"("guided_json": )" + Json(schema).dump()}) {  // a schema as a JSON text, too
    auto [st, j] = post("/v1/chat/completions", chat_body(rf));
    ASSERT_EQ(st, 200) << j.dump();
    for (const Json& ch : j.at("choices").as_array()) {
      EXPECT_EQ(ch.at("finish_reason").as_string(), "stop");
      const std::string text = ch.at("message").at("content").as_string();
      Json v;
      ASSERT_NO_THROW(v = Json::parse(text)) << text;
      EXPECT_EQ(test::schema_violation(v, s, s), "") << text;
    }
  }
  auto [so, jo] = post("/v1/completions", R"({"prompt": "x", "max_tokens": 60, "temperature": 1,
      "seed": 1, "n": 4, "response_format": {"type": "json_object"}})");
  ASSERT_EQ(so, 200) << jo.dump();
  for (const Json& ch : jo.at("choices").as_array())
    if (ch.at("finish_reason").as_string() == "stop") {
      EXPECT_TRUE(Json::parse(ch.at("text").as_string()).is_object());
    }
  const std::regex ref("[a-c]{2}[0-9]+x");
  for (const char* rx : {R"("guided_regex": "[a-c]{2}[0-9]+x")",
                         R"("structured_outputs": {"regex": "[a-c]{2}[0-9]+x"})"}) {
    auto [sr, jr] =
        post("/v1/completions", std::string(R"({"prompt": "x", "max_tokens": 40, "temperature": 1,
        "seed": 2, "n": 4, )") + rx +
                                    "}");
    ASSERT_EQ(sr, 200) << jr.dump();
    for (const Json& ch : jr.at("choices").as_array())
      if (ch.at("finish_reason").as_string() == "stop") {
        EXPECT_TRUE(std::regex_match(ch.at("text").as_string(), ref)) << ch.dump();
      }
  }
  for (const char* c : {R"("guided_choice": ["red", "green", "blue"])",
                        R"("structured_outputs": {"choice": ["red", "green", "blue"]})"}) {
    auto [sc, jc] =
        post("/v1/completions", std::string(R"({"prompt": "x", "max_tokens": 10, "temperature": 2,
        "seed": 4, "n": 6, )") + c + "}");
    ASSERT_EQ(sc, 200) << jc.dump();
    for (const Json& ch : jc.at("choices").as_array()) {
      const std::string t = ch.at("text").as_string();
      EXPECT_TRUE(t == "red" || t == "green" || t == "blue") << t;
    }
  }
}

TEST_F(Structured, ForcedToolCallsFollowTheToolsSchemas) {
  const Json tools = Json::parse(kWeather);
  auto [st, j] = post("/v1/chat/completions",
                      chat_body(R"("tools": )" + std::string(kWeather) +
                                R"(, "tool_choice": "required", "parallel_tool_calls": false)"));
  ASSERT_EQ(st, 200) << j.dump();
  for (const Json& ch : j.at("choices").as_array()) {
    EXPECT_EQ(ch.at("finish_reason").as_string(), "tool_calls") << ch.dump();
    const Json& m = ch.at("message");
    EXPECT_TRUE(m.at("content").is_null()) << m.dump();
    ASSERT_EQ(m.at("tool_calls").size(), 1u) << m.dump();
    const Json& call = m.at("tool_calls").as_array()[0];
    EXPECT_EQ(call.at("type").as_string(), "function");
    EXPECT_EQ(call.at("id").as_string().rfind("call_", 0), 0u);
    const std::string name = call.at("function").at("name").as_string();
    const Json& params =
        tools.as_array()[name == "get_weather" ? 0 : 1].at("function").at("parameters");
    const Json args = Json::parse(call.at("function").at("arguments").as_string());
    EXPECT_EQ(test::schema_violation(args, params, params), "") << args.dump();
  }
  // A named function: that one, streamed; the delta carries the call whole.
  std::string raw;
  auto [ss, js] =
      post("/v1/chat/completions",
           chat_body(R"("tools": )" + std::string(kWeather) +
                     R"(, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
                                 "stream": true)"),
           &raw);
  ASSERT_EQ(ss, 200) << raw;
  int calls = 0, finishes = 0;
  for (size_t pos = 0; (pos = raw.find("data: ", pos)) != std::string::npos;) {
    const size_t end = raw.find("\n\n", pos);
    const std::string data = raw.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") continue;
    const Json c = Json::parse(data).at("choices").as_array()[0];
    if (c.at("delta").contains("tool_calls")) {
      const Json& tc = c.at("delta").at("tool_calls").as_array()[0];
      EXPECT_EQ(tc.at("index").as_int(), 0);
      EXPECT_EQ(tc.at("function").at("name").as_string(), "get_time");
      const Json args = Json::parse(tc.at("function").at("arguments").as_string());
      EXPECT_TRUE(args.at("zone").is_string());
      ++calls;
    }
    if (c.at("delta").contains("content")) {
      EXPECT_EQ(c.at("delta").at("content").as_string(), "");  // only the role's first delta
    }
    if (!c.at("finish_reason").is_null()) {
      EXPECT_EQ(c.at("finish_reason").as_string(), "tool_calls");
      ++finishes;
    }
  }
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(finishes, 3);
}

TEST_F(Structured, ToolTurnsInTheHistoryAndNoneAndAuto) {
  const std::string history = R"({"messages": [
      {"role": "user", "content": "weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"}],
      "max_tokens": 8, "temperature": 0, "tools": )" +
                              std::string(kWeather);
  for (const char* choice : {R"("none")", R"("auto")"}) {
    auto [st, j] = post("/v1/chat/completions", history + R"(, "tool_choice": )" + choice + "}");
    ASSERT_EQ(st, 200) << j.dump();
    const Json& ch = j.at("choices").as_array()[0];
    EXPECT_TRUE(ch.at("message").at("content").is_string());
    EXPECT_FALSE(ch.at("message").contains("tool_calls"));
  }
  // The prompt holds the tools, the call and its result in the Hermes format.
  data::ChatTurn call{"assistant", "", {{"call_1", "get_weather", R"({"city":"Oslo"})"}}, ""};
  const auto turns = data::tool_conversation(
      "chatml", {{"user", "hi", {}, ""}, call, {"tool", "{\"temp\": 3}", {}, "call_1"}},
      {{"get_weather", "Weather of a city", Json::parse(R"({"type":"object"})")}});
  ASSERT_EQ(turns.size(), 4u);
  EXPECT_EQ(turns[0].role, "system");
  EXPECT_NE(
      turns[0].content.find("<tools>\n{\"function\": {\"description\": \"Weather of a city\""),
      std::string::npos)
      << turns[0].content;
  EXPECT_EQ(
      turns[2].content,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(turns[3].role, "user");
  EXPECT_EQ(turns[3].content, "<tool_response>\n{\"temp\": 3}\n</tool_response>");
  const auto llama = data::tool_conversation(
      "llama3", {{"user", "hi", {}, ""}, call, {"tool", "3", {}, "call_1"}}, {});
  EXPECT_EQ(llama[1].content, "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Oslo\"}}");
  EXPECT_EQ(llama[2].role, "ipython");
}

TEST_F(Structured, AutoReadsHermesCallsFromTheText) {
  const std::vector<data::ToolDef> tools = {{"f", "", Json::parse(R"({"type":"object"})")}};
  auto r = serve::parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
      "chatml", tools, true, "call_x");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": 1}");
  EXPECT_EQ(r.calls[1].id, "call_x_1");
  // Not a call: an unknown tool, arguments that are not an object, broken JSON.
  for (const char* t : {"<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
                        "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",
                        "<tool_call>{\"name\": \"f\", </tool_call>"}) {
    auto n = serve::parse_tool_calls(t, "chatml", tools, true, "c");
    EXPECT_TRUE(n.calls.empty()) << t;
    EXPECT_EQ(n.content, t);
  }
  // Streaming: content passes until a call may begin; the call comes out at the end.
  serve::ToolCallStream s("chatml", &tools, true, false, "call_y");
  std::string shown;
  for (const char* piece :
       {"Sure", ", <tool", "_call>\n{\"name\": \"f\", ", "\"arguments\": {}}", "\n</tool_call>"})
    shown += s.feed(piece);
  auto end = s.finish();
  EXPECT_EQ(shown, "Sure, ");  // the reply's content is "Sure,"; the space had been streamed
  EXPECT_EQ(end.content, "");
  ASSERT_EQ(end.calls.size(), 1u);
  serve::ToolCallStream plain("chatml", &tools, true, false, "call_z");
  EXPECT_EQ(plain.feed("a <b"), "a <b");
  EXPECT_EQ(plain.feed(" c <tool_c"), " c ");
  EXPECT_EQ(plain.finish().content, "<tool_c");
  auto llama = serve::parse_tool_calls(R"({"name": "f", "parameters": {"x": "y"}})", "llama3",
                                       tools, true, "c");
  ASSERT_EQ(llama.calls.size(), 1u);
  EXPECT_EQ(llama.calls[0].arguments, R"({"x": "y"})");
}

TEST_F(Structured, RefusalsNameTheFieldAndTheKeyword) {
  const std::string chat = "/v1/chat/completions", cmpl = "/v1/completions";
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  expect_400(chat, "{" + msgs + R"(, "response_format": {"type": "json_schema", "json_schema":
                 {"name": "x", "schema": {"type": "array", "uniqueItems": true}}}})",
             "unsupported keyword 'uniqueItems' at #/uniqueItems", "response_format");
  expect_400(
      chat,
      "{" + msgs + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})",
      "is required", "response_format.json_schema.schema");
  expect_400(chat, "{" + msgs + R"(, "response_format": {"type": "xml"}})", "must be text",
             "response_format.type");
  expect_400(chat, "{" + msgs + R"(, "response_format": {"type": "json_object", "schema": {}}})",
             "unknown field", "response_format.schema");
  expect_400(cmpl, R"({"prompt": "x", "structured_outputs": {"regex": "a", "whitespace": 1}})",
             "unknown field 'structured_outputs.whitespace'", "structured_outputs.whitespace");
  expect_400(cmpl, R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= \"a\""}})",
             "not supported", "structured_outputs.grammar");
  expect_400(cmpl, R"({"prompt": "x", "guided_regex": "(a)\\1"})", "backreference", "guided_regex");
  expect_400(cmpl, R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})",
             "both constrain the output", "guided_choice");
  expect_400(cmpl, R"({"prompt": "x", "guided_choice": []})", "non-empty array", "guided_choice");
  expect_400(cmpl, R"({"prompt": "x", "guided_grammar": "x"})", "not supported", "guided_grammar");
  expect_400(cmpl, R"({"prompt": "x", "guided_json": {"type": "object"}, "ignore_eos": true})",
             "ignore_eos", "ignore_eos");
  expect_400(cmpl, R"({"prompt": "x", "tools": []})", "for chat completions", "tools");
  const std::string bad_tool = R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"h": {"type": "string", "format": "hostname"}}}}}])";
  expect_400(chat, "{" + msgs + R"(, "tools": )" + bad_tool + "}", "unsupported format 'hostname'",
             "tools[0].function.parameters");
  expect_400(chat,
             "{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "a b"}}]})",
             "must be 1 to 64", "tools[0].function.name");
  expect_400(chat,
             "{" + msgs + R"(, "tools": )" + std::string(kWeather) +
                 R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}}})",
             "no tool is named 'nope'", "tool_choice.function.name");
  expect_400(chat, "{" + msgs + R"(, "tool_choice": "required"})", "needs 'tools'", "tool_choice");
  expect_400(chat,
             "{" + msgs + R"(, "tools": )" + std::string(kWeather) +
                 R"(, "tool_choice": "required", "guided_regex": "a"})",
             "both constrain", "guided_regex");
  expect_400(chat, R"({"messages": [{"role": "tool", "content": "3"}]})", "tool_call_id",
             "messages[0].tool_call_id");
  expect_400(chat, R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
                 "function": {"name": "f", "arguments": "{oops"}}]}]})",
             "not valid JSON", "messages[0].tool_calls[0].function.arguments");
}
