// The hf:PATH chat template (data/chat.h over data/hf_chat_template.h): a model's own Jinja
// template rendering chat data into ids and a loss mask (from {% generation %} blocks, else from
// rendering the conversation up to each assistant message), serving prompts, the markers it
// needs from the tokenizer, and its refusals.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "temp_dir.h"

namespace loom::data {
namespace {

const std::string kTemplates = std::string(LOOM_SOURCE_DIR) + "/tests/data/chat_templates";

// The trained ids of an example, decoded, one string per run of trained ids.
std::vector<std::string> trained_runs(const BpeTokenizer& tok, const ChatExample& ex) {
  std::vector<std::string> runs;
  std::vector<int32_t> cur;
  for (size_t i = 0; i <= ex.ids.size(); ++i) {
    if (i < ex.ids.size() && ex.mask[i]) {
      cur.push_back(ex.ids[i]);
    } else if (!cur.empty()) {
      runs.push_back(tok.decode(cur));
      cur.clear();
    }
  }
  return runs;
}

// A model directory holding tokenizer_config.json with `chat_template` and `eos_token`.
std::string model_dir(const test::TempDir& dir, const std::string& chat_template,
                      const std::string& eos = "<|im_end|>") {
  Json cfg = Json::object();
  cfg["chat_template"] = chat_template;
  cfg["eos_token"] = eos;
  write_file_atomic(dir.path + "/tokenizer_config.json", cfg.dump());
  return dir.path;
}

Json jsonl(const std::string& line) {
  return Json::parse(line);
}

TEST(ChatJinja, GenerationBlocksAreTheTrainedTokens) {
  const BpeTokenizer tok = byte_chatml_tokenizer();
  const ChatTemplate t("hf:" + kTemplates + "/chatml_generation", tok);
  EXPECT_TRUE(t.is_jinja());
  EXPECT_EQ(t.end_of_turn(), tok.special_id("<|im_end|>"));
  const ChatExample ex =
      parse_chat_example(jsonl(R"({"messages": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "<think>\nx\n</think>\n\nHello"},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                 "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
                {"role": "tool", "content": "4"},
                {"role": "assistant", "content": "4"}]})"),
                         t, "chat.jsonl:1");
  const std::string text =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>add(a=2, b=2)</tool_call><|im_end|>\n"
      "<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n";
  EXPECT_EQ(ex.ids, tok.encode(text));  // markers are special tokens, as HF tokenizes
  EXPECT_EQ(
      trained_runs(tok, ex),
      (std::vector<std::string>{"Hello<|im_end|>", "<tool_call>add(a=2, b=2)</tool_call><|im_end|>",
                                "4<|im_end|>"}));
}

TEST(ChatJinja, WithoutGenerationBlocksTheAssistantTextIsFoundByPrefixes) {
  const BpeTokenizer tok = byte_chatml_tokenizer();
  test::TempDir dir("chat_jinja");
  const ChatTemplate t("hf:" + model_dir(dir, ChatTemplate::jinja("chatml")), tok);
  const ChatTemplate builtin("chatml", tok);
  const std::vector<ChatMessage> conv = {
      {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}, {"assistant", "See you"}};
  const ChatExample ex = t.render(conv);
  EXPECT_EQ(ex.ids, builtin.render(conv).ids);
  // The built-in trains reply and <|im_end|>; rendering up to the reply also takes the newline
  // the template writes after it.
  EXPECT_EQ(trained_runs(tok, ex),
            (std::vector<std::string>{"Hello<|im_end|>\n", "See you<|im_end|>\n"}));
  EXPECT_EQ(trained_runs(tok, builtin.render(conv)),
            (std::vector<std::string>{"Hello<|im_end|>", "See you<|im_end|>"}));
  // Serving prompts end in the generation prompt, as the built-in's do.
  const std::vector<ChatMessage> prompt = {{"system", "S"}, {"user", "Q"}};
  EXPECT_EQ(t.prompt_ids(prompt), builtin.prompt_ids(prompt));
  EXPECT_EQ(
      tok.decode(t.prompt_ids(prompt)),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n");
  // Prompt/completion lines are a user turn and the assistant's reply.
  const ChatExample pc =
      parse_chat_example(jsonl(R"({"prompt": "P", "completion": "C"})"), t, "x:1");
  EXPECT_EQ(trained_runs(tok, pc), (std::vector<std::string>{"C<|im_end|>\n"}));
}

TEST(ChatJinja, NamesOfTheModelsTokens) {
  test::TempDir dir("chat_jinja");
  Json cfg = Json::object();
  cfg["chat_template"] =
      "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}";
  Json bos = Json::object();
  bos["content"] = "<|im_start|>";  // the AddedToken form
  cfg["bos_token"] = bos;
  cfg["eos_token"] = "<|im_end|>";
  write_file_atomic(dir.path + "/tokenizer_config.json", cfg.dump());
  const std::string name = "hf:" + dir.path;
  EXPECT_EQ(ChatTemplate::begin_of_text_token(name), "<|im_start|>");
  EXPECT_EQ(ChatTemplate::end_of_turn_token(name), "<|im_end|>");
  EXPECT_EQ(ChatTemplate::special_tokens(name),
            (std::vector<std::string>{"<|im_start|>", "<|im_end|>"}));
  EXPECT_EQ(ChatTemplate::jinja(name), cfg.at("chat_template").as_string());
}

TEST(ChatJinja, ToolsOfAChatLineReachTheTemplate) {
  const BpeTokenizer tok = byte_chatml_tokenizer();
  test::TempDir dir("chat_jinja");
  const ChatTemplate t(
      "hf:" + model_dir(dir,
                        "{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
                        "{% for m in messages %}{% if m.content is none %}<null>{% else %}"
                        "{{ m.content }}{% endif %}<|im_end|>{% endfor %}"),
      tok);
  const ChatExample ex =
      parse_chat_example(jsonl(R"({"tools": [{"type": "function", "function": {"name": "f"}}],
                "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": null},
                             {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}]})"),
                         t, "x:1");
  EXPECT_EQ(tok.decode(ex.ids), "[f]u<|im_end|><null><|im_end|>r<|im_end|>a<|im_end|>");
  EXPECT_EQ(trained_runs(tok, ex), (std::vector<std::string>{"<null><|im_end|>", "a<|im_end|>"}));
}

TEST(ChatJinjaBadInput, Refusals) {
  const BpeTokenizer tok = byte_chatml_tokenizer();
  test::TempDir dir("chat_jinja");
  auto error_of = [&](auto f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // A marker the tokenizer lacks.
  EXPECT_EQ(
      error_of([&] { ChatTemplate t("hf:" + model_dir(dir, "x", "<|eot_id|>"), tok); }),
      "chat template hf:" + dir.path +
          " needs the special token <|eot_id|>, which the tokenizer does not have (add it as a "
          "special token)");
  // A template whose text for the conversation so far changes with later messages.
  const ChatTemplate last_only("hf:" + model_dir(dir,
                                                 "{% for m in messages %}{{ m.content }}{% if "
                                                 "loop.last %}<|im_end|>{% endif %}{% endfor %}"),
                               tok);
  EXPECT_EQ(
      error_of([&] {
        parse_chat_example(jsonl(R"({"messages": [{"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]})"),
                           last_only, "chat.jsonl:3");
      }),
      "chat.jsonl:3: messages[1]: chat template hf:" + dir.path +
          " renders the conversation up to this assistant message differently from the start "
          "of the whole conversation, so its trained tokens cannot be located (mark them in the "
          "template with {% generation %} ... {% endgeneration %})");
  const ChatTemplate t("hf:" + model_dir(dir, ChatTemplate::jinja("chatml")), tok);
  EXPECT_EQ(error_of([&] {
              parse_chat_example(
                  jsonl(R"({"messages": [{"role": "user", "content": "u"}], "x": 1})"), t, "c:2");
            }),
            "c:2: field 'x' is not read (a chat line has 'messages' and optionally 'tools')");
  EXPECT_EQ(error_of([&] {
              parse_chat_example(jsonl(R"({"messages": [{"role": "user", "content": "u"}]})"), t,
                                 "c:4");
            }),
            "c:4: no assistant message, so nothing to learn");
  EXPECT_EQ(
      error_of([&] { parse_chat_example(jsonl(R"({"messages": [{"content": "u"}]})"), t, "c:5"); }),
      "c:5: messages[0] must be an object with a string 'role'");
  // raise_exception inside the template names the line of the data and of the template.
  const ChatTemplate raising(
      "hf:" + model_dir(dir, "\n{{ raise_exception('no ' ~ messages[0].role) }}"), tok);
  EXPECT_EQ(
      error_of([&] {
        parse_chat_example(jsonl(R"({"messages": [{"role": "assistant", "content": "a"}]})"),
                           raising, "c:6");
      }),
      "c:6: " + dir.path + "/tokenizer_config.json chat_template:2: raise_exception: no assistant");
  EXPECT_EQ(error_of([&] { ChatTemplate bad("hf:" + model_dir(dir, "{% for %}"), tok); }),
            dir.path + "/tokenizer_config.json chat_template:1: expected a name, found end of tag");
}

}  // namespace
}  // namespace loom::data
