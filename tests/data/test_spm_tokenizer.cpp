// Unigram models in tokenizer.json and SentencePiece tokenizer.model files
// (tests/data/fixtures/spm, made by make_spm_fixtures.sh with spm_train): Loom's own Viterbi on
// the tokenizer.json form of a model gives the ids the SentencePiece library gives on the model
// itself; tokenizer.model files load wherever a spec does, are written back as themselves, and
// bad ones are refused naming the file. Bad Unigram tokenizer.json files name the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/bpe.h"
#include "data/hf_pipeline.h"
#include "data/hf_tokenizer.h"
#include "data/spm_tokenizer.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::data;

namespace {

const std::string kSpm = std::string(LOOM_DATA_FIXTURES) + "/spm";

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    const Json j =
        Json::parse(read_file(std::string(LOOM_DATA_FIXTURES) + "/../hf_tokenizer_corpus.json"));
    for (const Json& t : j.as_array()) out.push_back(t.as_string());
    return out;
  }();
  return texts;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

void expect_error(const std::function<void()>& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no error: " << *needles.begin();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << m;
  }
}

Json unigram_json() {
  return Json::parse(read_file(kSpm + "/unigram.tokenizer.json"));
}

}  // namespace

// The Unigram tokenizer.json of each model against the SentencePiece library on the model.
// Left out, where the two formats differ by design: texts starting with white space (or ▁), as
// SentencePiece's dummy prefix is added before them too and Metaspace (Hugging Face's
// conversion) only where the text does not start with ▁ already; and texts spelling a byte
// piece (<0x41>), which SentencePiece keeps out of its lattice and tokenizer.json models match
// as text.
TEST(SpmTokenizer, UnigramJsonEncodesAsSentencePieceOnTheModel) {
  if (!LOOM_HAVE_SPM) GTEST_SKIP() << "this build has no libsentencepiece";
  for (const char* name : {"unigram", "unigram_bytes"}) {
    const BpeTokenizer json = load_hf_tokenizer(kSpm + "/" + name + ".tokenizer.json");
    const BpeTokenizer spm = load_spm_tokenizer(kSpm + "/" + name + ".model");
    ASSERT_TRUE(json.unigram());
    EXPECT_EQ(json.vocab_size(), spm.vocab_size());
    size_t compared = 0;
    for (const std::string& text : corpus()) {
      if (text.empty() || text[0] == ' ' || text[0] == '\t' || text[0] == '\n' ||
          text.rfind("\u2581", 0) == 0 || text.rfind("\u3000", 0) == 0 ||
          text.find("<0x") != std::string::npos)
        continue;
      ++compared;
      EXPECT_EQ(show(json.encode(text, false)), show(spm.encode(text, false)))
          << name << ": " << Json(text).dump();
    }
    EXPECT_GT(compared, 45u);
  }
}

// Byte fallback: a character outside the vocabulary becomes its UTF-8 bytes' tokens, which
// decode back to it; without byte fallback unknown characters in a row become one <unk>.
TEST(SpmTokenizer, UnigramUnknownCharacters) {
  const BpeTokenizer bytes = load_hf_tokenizer(kSpm + "/unigram_bytes.tokenizer.json");
  const BpeTokenizer plain = load_hf_tokenizer(kSpm + "/unigram.tokenizer.json");
  const std::string text = "a \xF0\x9F\x98\x80\xF0\x9F\x98\x83 b";  // two emoji
  const std::vector<int32_t> ids = bytes.encode(text);
  EXPECT_EQ(bytes.decode(ids), text);
  size_t byte_tokens = 0;
  for (int32_t id : ids) byte_tokens += bytes.token_bytes(id).rfind("<0x", 0) == 0;
  EXPECT_EQ(byte_tokens, 8u);
  const int32_t unk = plain.hf_pipeline()->unk_id;
  const std::vector<int32_t> u = plain.encode(text);
  EXPECT_EQ(std::count(u.begin(), u.end(), unk), 1) << show(u);
}

TEST(SpmTokenizer, ModelFilesLoadFromEverySpec) {
  if (!LOOM_HAVE_SPM) GTEST_SKIP() << "this build has no libsentencepiece";
  test::TempDir dir("spm");
  write_file_atomic(dir.path + "/tokenizer.model", read_file(kSpm + "/bpe.model"));
  const std::string text = "Loom reads tokenizer.model files: 12345 \xE2\x9C\x93";
  const std::vector<int32_t> want = load_spm_tokenizer(kSpm + "/bpe.model").encode(text);
  for (const std::string& spec :
       {"spm:" + kSpm + "/bpe.model", kSpm + "/bpe.model", "spm:" + dir.path, dir.path}) {
    const auto tok = load_tokenizer(spec);
    EXPECT_EQ(tok->encode(text), want) << spec;
    EXPECT_EQ(tok->decode(want), text) << spec;
  }
  // Streaming: each piece's text, ▁ as a space and byte pieces as their bytes.
  const auto tok = load_tokenizer(dir.path);
  std::string streamed;
  for (int32_t id : want) tok->decode_append(id, streamed);
  EXPECT_EQ(streamed, " " + text);
  // <s> and </s> are specials: cut out of the text, <s> put in front by post_process.
  const int32_t bos = tok->special_id("<s>"), eos = tok->special_id("</s>");
  ASSERT_GE(bos, 0);
  ASSERT_GE(eos, 0);
  std::vector<int32_t> ids = tok->encode("hi</s>");
  EXPECT_EQ(ids.back(), eos);
  EXPECT_NE(tok->encode("hi</s>", false).back(), eos);
  tok->post_process(ids);
  EXPECT_EQ(ids.front(), bos);
}

TEST(SpmTokenizer, SavedAsTheModelFileItself) {
  if (!LOOM_HAVE_SPM) GTEST_SKIP() << "this build has no libsentencepiece";
  test::TempDir dir("spm_save");
  const BpeTokenizer tok = load_spm_tokenizer(kSpm + "/unigram.model");
  save_hf_tokenizer(tok, dir.path, "", 2048);
  EXPECT_EQ(read_file(dir.path + "/tokenizer.model"), read_file(kSpm + "/unigram.model"));
  EXPECT_FALSE(file_exists(dir.path + "/tokenizer.json"));
  const Json cfg = Json::parse(read_file(dir.path + "/tokenizer_config.json"));
  EXPECT_EQ(cfg.at("tokenizer_class").as_string(), "LlamaTokenizer");
  EXPECT_EQ(cfg.at("bos_token").as_string(), "<s>");
  EXPECT_EQ(cfg.at("eos_token").as_string(), "</s>");
  const std::string text = corpus()[1];
  EXPECT_EQ(load_tokenizer(dir.path)->encode(text), tok.encode(text));
  expect_error([&] { hf_tokenizer_json(tok); }, {"tokenizer.model"});
  expect_error([&] { tiktoken_text(tok); }, {"tokenizer.model"});
}

TEST(SpmTokenizer, BadModelFilesNameTheFile) {
  test::TempDir dir("spm_bad");
  const std::string good = read_file(kSpm + "/bpe.model");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"truncated.model", good.substr(0, good.size() / 2)},
      {"empty.model", ""},
      {"text.model", "this is not a protobuf at all\n"},
      {"flipped.model", [&] {
         std::string s = good;
         for (size_t i = 0; i < s.size(); i += 7) s[i] = char(s[i] ^ 0x5A);
         return s;
       }()}};
  for (const auto& [name, bytes] : bad) {
    const std::string path = dir.path + "/" + name;
    write_file_atomic(path, bytes);
    expect_error([&] { load_spm_tokenizer(path); }, {path});
    expect_error([&] { load_tokenizer(path); }, {path});
  }
  if (!LOOM_HAVE_SPM)
    expect_error([&] { load_spm_tokenizer(kSpm + "/bpe.model"); }, {"libsentencepiece-dev"});
}

TEST(SpmTokenizer, BadUnigramJsonNamesTheField) {
  auto refused = [](const std::function<void(Json&)>& edit,
                    std::initializer_list<std::string> needles) {
    Json j = unigram_json();
    edit(j);
    expect_error([&] { hf_tokenizer_from_json(j, "uni.json"); }, needles);
  };
  refused([](Json& j) { j["model"]["vocab"].as_array()[5] = Json("piece"); },
          {"uni.json", "'model.vocab[5]'", "[piece, score]"});
  refused([](Json& j) { j["model"]["vocab"].as_array()[7].as_array()[1] = Json("x"); },
          {"'model.vocab[7]'"});
  refused([](Json& j) { j["model"]["vocab"].as_array()[9] = j["model"]["vocab"].as_array()[8]; },
          {"'model.vocab[9]'", "repeats"});
  refused([](Json& j) { j["model"]["unk_id"] = 100000; }, {"'model.unk_id'"});
  refused([](Json& j) { j["model"]["vocab"] = Json::array(); }, {"'model.vocab'", "empty"});
  refused([](Json& j) { j["model"]["type"] = "WordLevel"; }, {"'model.type'", "WordLevel"});
  refused(
      [](Json& j) {
        Json n = Json::object();
        n["type"] = "Precompiled";
        n["precompiled_charsmap"] = "ALQCAACEAAAAAACAAQAAgMz8AgC4BQAAhyIAgMzkAgC4PQAAeyIAgMzs";
        Json seq = Json::object();
        seq["type"] = "Sequence";
        seq["normalizers"] = Json(Json::Array{n});
        j["normalizer"] = seq;
      },
      {"'normalizer.normalizers[0].precompiled_charsmap'"});
  refused(
      [](Json& j) {
        Json b = Json::object();
        b["type"] = "ByteLevel";
        b["add_prefix_space"] = false;
        j["pre_tokenizer"] = b;
      },
      {"Unigram", "ByteLevel"});
  refused([](Json& j) { j["added_tokens"].as_array()[1]["id"] = 5; }, {"added token", "<s>"});
}
