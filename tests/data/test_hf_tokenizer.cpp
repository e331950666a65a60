// Hugging Face tokenizer.json as a Loom tokenizer (data/hf_tokenizer.h): identical ids to the
// reference for every case, added and special tokens, the spec forms, and the writer's output
// read back (GPT-2's merge rule and tiktoken's rule through ignore_merges).
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/fs.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "data/hf_tokenizer.h"
#include "data/normalize.h"
#include "hf_tokenizer_util.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::data;
using loom::test::gpt2_tokenizer_json;
using loom::test::kTokDir;
using loom::test::tok_cases;

namespace {

const BpeTokenizer& hf_gpt2() {
  static BpeTokenizer t = hf_tokenizer_from_json(gpt2_tokenizer_json(false), "gpt2.json");
  return t;
}

Json added_token(int id, const std::string& content, bool special) {
  Json a = Json::object();
  a["id"] = id;
  a["content"] = content;
  a["special"] = special;
  a["lstrip"] = false;
  a["rstrip"] = false;
  a["single_word"] = false;
  a["normalized"] = false;
  return a;
}

std::vector<int32_t> cat_ids(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

TEST(HfTokenizer, Gpt2AsTokenizerJsonMatchesReferenceOnAllCases) {
  ASSERT_GE(tok_cases().size(), 30u);
  for (const auto& c : tok_cases()) {
    EXPECT_EQ(hf_gpt2().encode(c.text), c.gpt2) << c.text;
    EXPECT_EQ(hf_gpt2().decode(c.gpt2), c.text);
  }
  EXPECT_EQ(hf_gpt2().vocab_size(), 50257);
  EXPECT_EQ(hf_gpt2().eot_id(), 50256);
  EXPECT_EQ(hf_gpt2().encode("a<|endoftext|>b"), (std::vector<int32_t>{64, 50256, 65}));
}

TEST(HfTokenizer, MergesAsPairsReadTheSameAsStrings) {
  BpeTokenizer pairs = hf_tokenizer_from_json(gpt2_tokenizer_json(true), "pairs.json");
  for (const auto& c : tok_cases()) EXPECT_EQ(pairs.encode(c.text), c.gpt2) << c.text;
}

TEST(HfTokenizer, AddedTokensAreCutOutWithTheirOwnIds) {
  Json j = gpt2_tokenizer_json(false);
  j["added_tokens"].push_back(added_token(50257, "<|im_start|>", true));
  j["added_tokens"].push_back(added_token(50258, "<|im_end|>", true));
  j["added_tokens"].push_back(added_token(50260, "[TOOL]", false));  // not special, a hole before
  BpeTokenizer t = hf_tokenizer_from_json(j, "added.json");
  EXPECT_EQ(t.vocab_size(), 50261);
  const std::vector<int32_t> user = hf_gpt2().encode("user\nHi there");
  EXPECT_EQ(t.encode("<|im_start|>user\nHi there<|im_end|>"), cat_ids({{50257}, user, {50258}}));
  EXPECT_EQ(t.encode("x[TOOL]y"), cat_ids({hf_gpt2().encode("x"), {50260}, hf_gpt2().encode("y")}));
  EXPECT_EQ(t.decode(t.encode("<|im_start|>a[TOOL]<|endoftext|>")),
            "<|im_start|>a[TOOL]<|endoftext|>");
  // The markers are single ids, so a chat template can use them.
  ChatTemplate chat("chatml", t);
  EXPECT_EQ(chat.end_of_turn(), 50258);
}

TEST(HfTokenizer, SpecsNameTokenizerJsonFilesAndFolders) {
  loom::test::TempDir tmp("hftok_spec");
  write_file_atomic(tmp / "tokenizer.json", gpt2_tokenizer_json(false).dump());
  const std::string text = tok_cases()[10].text;
  const std::vector<int32_t> want = tok_cases()[10].gpt2;
  for (const std::string& spec :
       {"hf:" + tmp.path, "hf:" + (tmp / "tokenizer.json"), tmp.path, tmp / "tokenizer.json"})
    EXPECT_EQ(load_tokenizer(spec)->encode(text), want) << spec;
  // Loom's own folder also holds a tokenizer.json: it is still read as Loom's.
  loom::test::TempDir own("hftok_loom");
  save_loom_tokenizer(hf_gpt2(), own.path);
  EXPECT_EQ(load_tokenizer(own.path)->encode(text), want);
}

TEST(HfTokenizer, WrittenGpt2ReadsBackWithIdenticalIds) {
  const Json j = hf_tokenizer_json(hf_gpt2());
  EXPECT_EQ(j.at("model").at("ignore_merges").as_bool(), false);
  EXPECT_EQ(j.at("model").at("vocab").size(), 50256u);  // <|endoftext|> is an added token
  BpeTokenizer back = hf_tokenizer_from_json(Json::parse(j.dump()), "written.json");
  for (const auto& c : tok_cases()) EXPECT_EQ(back.encode(c.text), c.gpt2) << c.text;
  EXPECT_EQ(back.eot_id(), 50256);
}

TEST(HfTokenizer, WrittenTiktokenVocabularyReadsBackWithIdenticalIds) {
  // cl100k_base is a rank file: written as merges in rank order with ignore_merges and the
  // Llama 3 (= cl100k) Split regex, it must encode exactly as tiktoken does.
  BpeTokenizer cl = load_tiktoken(kTokDir + "/cl100k_base.tiktoken");
  const Json j = hf_tokenizer_json(cl);
  EXPECT_TRUE(j.at("model").at("ignore_merges").as_bool());
  EXPECT_EQ(j.at("pre_tokenizer").at("type").as_string(), "Sequence");
  BpeTokenizer back = hf_tokenizer_from_json(Json::parse(j.dump()), "cl100k.json");
  EXPECT_EQ(back.pretokenizer(), PreTokenizer::Cl100k);
  for (const auto& c : tok_cases()) EXPECT_EQ(back.encode(c.text), c.cl100k) << c.text;
  EXPECT_EQ(back.special_id("<|endofprompt|>"), 100276);
}

TEST(HfTokenizer, Qwen2RegexSplitsDigitsOneByOne) {
  Json j = gpt2_tokenizer_json(false);
  Json split = Json::object();
  split["type"] = "Split";
  split["pattern"]["Regex"] =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  split["behavior"] = "Isolated";
  split["invert"] = false;
  Json bl = Json::parse(j.at("pre_tokenizer").dump());  // Json copies share; this one is new
  bl["use_regex"] = false;
  Json seq = Json::object();
  seq["type"] = "Sequence";
  seq["pretokenizers"] = Json(Json::Array{split, bl});
  j["pre_tokenizer"] = seq;
  BpeTokenizer t = hf_tokenizer_from_json(j, "qwen2.json");
  EXPECT_EQ(t.pretokenizer(), PreTokenizer::Qwen2);
  std::vector<std::string> pieces;
  for_each_piece(PreTokenizer::Qwen2, "abc 1234x",
                 [&](std::string_view p) { pieces.emplace_back(p); });
  EXPECT_EQ(pieces, (std::vector<std::string>{"abc", " ", "1", "2", "3", "4", "x"}));
  // Each digit is its own GPT-2 token ("1" = 16).
  EXPECT_EQ(t.encode("1234"), (std::vector<int32_t>{16, 17, 18, 19}));
}

TEST(HfTokenizer, TokenizerConfigCarriesTheChatTemplateAndSpecialTokens) {
  Json j = gpt2_tokenizer_json(false);
  j["added_tokens"].push_back(added_token(50257, "<|im_start|>", true));
  j["added_tokens"].push_back(added_token(50258, "<|im_end|>", true));
  BpeTokenizer t = hf_tokenizer_from_json(j, "chat.json");
  loom::test::TempDir tmp("hftok_save");
  save_hf_tokenizer(t, tmp.path, "chatml", 1024);
  const Json cfg = Json::parse(read_file(tmp / "tokenizer_config.json"));
  EXPECT_EQ(cfg.at("eos_token").as_string(), "<|im_end|>");
  EXPECT_EQ(cfg.at("pad_token").as_string(), "<|endoftext|>");
  EXPECT_EQ(cfg.at("model_max_length").as_int(), 1024);
  EXPECT_EQ(cfg.at("chat_template").as_string(), ChatTemplate::jinja("chatml"));
  EXPECT_EQ(cfg.at("added_tokens_decoder").at("50258").at("content").as_string(), "<|im_end|>");
  const HfSpecialIds ids = hf_special_ids(t, "chatml");
  EXPECT_EQ(ids.eos, (std::vector<int32_t>{50258, 50256}));
  // The written tokenizer.json is the same tokenizer.
  BpeTokenizer back = load_hf_tokenizer(tmp.path);
  EXPECT_EQ(back.encode("<|im_start|>hi<|im_end|>"), t.encode("<|im_start|>hi<|im_end|>"));
  EXPECT_THROW(save_hf_tokenizer(t, tmp / "other", "vicuna", 1024), Error);
}

TEST(HfTokenizer, Qwen2NfcNormalizerComposesBeforeEncoding) {
  if (!nfc_available()) GTEST_SKIP() << "built without utf8proc: NFC tokenizers are refused";
  Json j = gpt2_tokenizer_json(false);
  j["normalizer"]["type"] = "NFC";
  // Qwen2's added tokens are matched in the raw text (normalized false), which keeps the file on
  // Loom's scanners; a normalized one is matched in the NFC text, through the pipeline.
  j["added_tokens"].as_array()[0]["normalized"] = false;
  BpeTokenizer t = hf_tokenizer_from_json(j, "nfc.json");
  ASSERT_TRUE(t.nfc());
  // "e" + U+0301 (combining acute) is "é" in NFC: the same ids as the precomposed text.
  const std::string decomposed =
                        "caf"
                        "e\xcc\x81 <|endoftext|>",
                    composed = "caf\xc3\xa9 <|endoftext|>";
  EXPECT_EQ(t.encode(decomposed), hf_gpt2().encode(composed));
  EXPECT_NE(hf_gpt2().encode(decomposed), hf_gpt2().encode(composed));
  EXPECT_EQ(t.encode("\xff\xfe bytes"), hf_gpt2().encode("\xff\xfe bytes"));  // not UTF-8: as is
  // Written and read back, in both formats, the normalizer stays.
  EXPECT_TRUE(hf_tokenizer_from_json(Json::parse(hf_tokenizer_json(t).dump()), "w.json").nfc());
  loom::test::TempDir tmp("hftok_nfc");
  save_loom_tokenizer(t, tmp.path);
  EXPECT_EQ(load_tokenizer("loom:" + tmp.path)->encode(decomposed), t.encode(decomposed));
}
