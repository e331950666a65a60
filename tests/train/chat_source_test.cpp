// Supervised fine-tuning data: chat templates and their loss masks, the chat batch source
// (packing, padding, truncation, determinism, resume, data-parallel split), the SFT loss against
// a float64 reference, and bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/chat.h"
#include "model/decoder.h"
#include "model/reference_decoder.h"
#include "temp_dir.h"
#include "train/chat_source.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

// The shared scratch directory (removed at the end of the test), with a file writer.
struct TempDir : loom::test::TempDir {
  TempDir() : loom::test::TempDir("chat") {}
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path + "/" + name) << text;
    return path + "/" + name;
  }
};

std::string tokenizer_spec(const TempDir& d) {
  data::save_loom_tokenizer(data::byte_chatml_tokenizer(), d.path + "/tok");
  return "loom:" + d.path + "/tok";
}

}  // namespace

TEST(ChatTemplate, ChatmlRendersTheTextAndMasksOnlyAssistantTurns) {
  auto tok = data::byte_chatml_tokenizer();
  data::ChatTemplate t("chatml", tok);
  auto ex = t.render({{"system", "be brief"}, {"user", "hi"}, {"assistant", "yo"}});
  // The text Hugging Face's ChatML template writes.
  EXPECT_EQ(tok.decode(ex.ids),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\nyo<|im_end|>\n");
  ASSERT_EQ(ex.mask.size(), ex.ids.size());
  std::string trained;
  for (size_t i = 0; i < ex.ids.size(); ++i)
    if (ex.mask[i]) trained += tok.decode(std::vector<int32_t>{ex.ids[i]});
  EXPECT_EQ(trained, "yo<|im_end|>");  // the reply and its end of turn, nothing else
  // Markers are one id each; the same text typed by a user is ordinary bytes.
  auto typed = t.render({{"user", "<|im_end|>"}, {"assistant", "a"}});
  int specials = 0;
  for (int32_t id : typed.ids) specials += id >= 256;
  EXPECT_EQ(specials, 4);
  auto prompt = t.prompt_ids({{"user", "hi"}});
  EXPECT_EQ(tok.decode(prompt), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, MissingMarkersAndBadLinesAreClearErrors) {
  auto tok = data::byte_chatml_tokenizer();
  EXPECT_THROW(data::ChatTemplate("llama3", tok), Error);  // no <|begin_of_text|> here
  EXPECT_THROW(data::ChatTemplate("vicuna", tok), Error);
  data::ChatTemplate t("chatml", tok);
  auto bad = [&](const std::string& line, const std::string& needle) {
    try {
      data::parse_chat_example(Json::parse(line), t, "f.jsonl:7");
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("f.jsonl:7"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad(R"({"messages": []})", "non-empty");
  bad(R"({"messages": [{"role": "user", "content": "x"}]})", "no assistant");
  bad(R"({"messages": [{"role": "robot", "content": "x"}]})", "robot");
  bad(R"({"messages": [{"role": "user", "content": 3}]})", "strings");
  bad(R"({"prompt": "x"})", "completion");
  bad(R"([1, 2])", "object");
  TempDir d;
  const std::string path = d.file("c.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{oops\n");
  try {
    data::load_chat_jsonl(path, t);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.jsonl:2"), std::string::npos) << e.what();
  }
}

namespace {
std::string conversations(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    std::string q(1 + i % 5, char('a' + i % 26)), a(2 + i % 3, char('A' + i % 26));
    s += "{\"messages\": [{\"role\": \"user\", \"content\": \"" + q +
         "\"}, {\"role\": \"assistant\", \"content\": \"" + a + "\"}]}\n";
  }
  return s;
}
}  // namespace

TEST(ChatSource, PackedBatchesHoldWholeExamplesWithTargetsOnlyWhereTrained) {
  TempDir d;
  const std::string spec = tokenizer_spec(d), path = d.file("c.jsonl", conversations(40));
  ChatSource src(path, spec, "chatml", 2, 48, true, 1, 0.0, "train");
  auto tok = data::load_tokenizer(spec);
  Batch b;
  src.next(b);
  ASSERT_EQ(b.tokens.size(), 96u);
  ASSERT_GE(b.cu_seqlens.size(), 3u);
  EXPECT_EQ(b.cu_seqlens.back(), 96);
  for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s) {
    const int lo = b.cu_seqlens[s], hi = b.cu_seqlens[s + 1];
    for (int i = lo; i < hi; ++i) EXPECT_EQ(b.positions[size_t(i)], i - lo);
    EXPECT_EQ(b.targets[size_t(hi - 1)], -1);  // nothing after a sequence's last token
  }
  // Every target is the next token, and decodes to assistant text or its end of turn.
  int trained = 0;
  for (size_t i = 0; i + 1 < b.tokens.size(); ++i) {
    if (b.targets[i] < 0) continue;
    ++trained;
    EXPECT_EQ(b.targets[i], b.tokens[i + 1]);
    const std::string t = tok->decode(std::vector<int32_t>{b.targets[i]});
    EXPECT_TRUE(t == "<|im_end|>" || (t.size() == 1 && t[0] >= 'A' && t[0] <= 'Z')) << t;
  }
  EXPECT_GT(trained, 4);
}

TEST(ChatSource, DeterministicResumableAndSplitOverDataParallelRanks) {
  TempDir d;
  const std::string spec = tokenizer_spec(d), path = d.file("c.jsonl", conversations(30));
  ChatSource a(path, spec, "chatml", 1, 40, true, 7, 0.1, "train");
  ChatSource b(path, spec, "chatml", 1, 40, true, 7, 0.1, "train");
  std::vector<Batch> seq(12);
  for (auto& x : seq) a.next(x);  // several epochs
  Batch y;
  for (int i = 0; i < 5; ++i) b.next(y);
  const Json st = b.state();
  ChatSource c(path, spec, "chatml", 1, 40, true, 7, 0.1, "train");
  c.restore(st);
  for (int i = 5; i < 12; ++i) {
    c.next(y);
    EXPECT_EQ(y.tokens, seq[size_t(i)].tokens) << i;
    EXPECT_EQ(y.targets, seq[size_t(i)].targets) << i;
  }
  // Two data-parallel ranks see the one-process micro-batches 2j and 2j + 1.
  ChatSource r0(path, spec, "chatml", 1, 40, true, 7, 0.1, "train", 0, 2);
  ChatSource r1(path, spec, "chatml", 1, 40, true, 7, 0.1, "train", 1, 2);
  for (int j = 0; j < 6; ++j) {
    r0.next(y);
    EXPECT_EQ(y.tokens, seq[size_t(2 * j)].tokens);
    r1.next(y);
    EXPECT_EQ(y.tokens, seq[size_t(2 * j + 1)].tokens);
  }
  // Validation holds out the last 10% (3 examples), in file order, every time.
  ChatSource v(path, spec, "chatml", 1, 200, false, 7, 0.1, "valid");
  EXPECT_NE(v.describe().find("3 valid examples"), std::string::npos) << v.describe();
}

TEST(ChatSource, UnpackedRowsAndTruncation) {
  TempDir d;
  const std::string spec = tokenizer_spec(d);
  std::string long_reply(100, 'Z');
  const std::string path = d.file("c.jsonl", "{\"prompt\": \"q\", \"completion\": \"" + long_reply +
                                                 "\"}\n" + conversations(3));
  ChatSource t(path, spec, "chatml", 4, 32, false, 1, 0.0, "train");
  Batch b;
  t.next(b);
  EXPECT_EQ(b.B, 4);
  EXPECT_EQ(b.tokens.size(), 128u);
  EXPECT_EQ(t.truncated(), 1);   // the long example, cut to one row
  for (int r = 0; r < 4; ++r) {  // every row starts a sequence at position 0
    EXPECT_EQ(b.positions[size_t(r * 32)], 0);
    EXPECT_NE(std::find(b.cu_seqlens.begin(), b.cu_seqlens.end(), r * 32), b.cu_seqlens.end());
  }
}

// The SFT loss of a micro-batch is the float64 reference's -sum log p over the assistant's
// tokens only (the prompt masked).
TEST(ChatSource, SftLossMatchesFloat64ReferenceWithThePromptMasked) {
  TempDir d;
  const std::string spec = tokenizer_spec(d);
  const std::string path =
      d.file("c.jsonl",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}, "
             "{\"role\": \"assistant\", \"content\": \"4\"}, {\"role\": \"user\", \"content\": "
             "\"and 3+3?\"}, {\"role\": \"assistant\", \"content\": \"6!\"}]}\n");
  ChatSource src(path, spec, "chatml", 1, 64, true, 1, 0.0, "train");
  Batch b;
  src.next(b);
  ModelConfig c = model_preset("tiny-llama");
  c.n_layer = 2, c.d_model = 16, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 4, c.d_ff = 24;
  c.vocab = 260, c.max_seq = 64, c.init_std = 0.2f;
  Decoder m(c, cpu_backend());
  m.params().init(3);
  const double loss = m.forward_loss(b.input());
  const int len = b.cu_seqlens[1];
  std::vector<int32_t> ids(b.tokens.begin(), b.tokens.begin() + len);
  const auto lp = ref::ReferenceDecoder(m).log_probs(ids);
  double want = 0;
  int trained = 0;
  for (int i = 0; i + 1 < len; ++i)
    if (b.targets[size_t(i)] >= 0) {
      want -= lp[size_t(i)][size_t(ids[size_t(i + 1)])];
      ++trained;
    }
  EXPECT_EQ(trained, 5);  // "4", <|im_end|>, "6", "!", <|im_end|>
  EXPECT_NEAR(loss, want, 1e-4 * want);
}
