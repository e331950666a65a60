// Bad tokenizer.json files: each refused with an error naming the field (or the position of
// malformed JSON), never loaded as a tokenizer with different ids.
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "core/fs.h"
#include "data/hf_tokenizer.h"
#include "hf_tokenizer_util.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::data;
using loom::test::gpt2_tokenizer_json;

namespace {

const Json& base() {
  static const Json j = gpt2_tokenizer_json(false);
  return j;
}

// Loads base() changed by `edit`; expects an error whose text contains every `needles`.
void expect_refused(const std::function<void(Json&)>& edit,
                    std::initializer_list<std::string> needles) {
  Json j = Json::parse(base().dump());  // a deep copy: Json shares arrays and objects
  edit(j);
  try {
    hf_tokenizer_from_json(j, "tok.json");
    ADD_FAILURE() << "loaded: " << *needles.begin();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tok.json"), std::string::npos) << m;
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << m;
  }
}

}  // namespace

TEST(HfTokenizerBad, UnsupportedModelsAndPartsAreRefusedNamingTheField) {
  expect_refused([](Json& j) { j["model"]["type"] = "WordPiece"; }, {"'model.type'", "WordPiece"});
  expect_refused([](Json& j) { j["model"]["byte_fallback"] = true; },
                 {"model.byte_fallback", "ByteLevel"});
  expect_refused([](Json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout"});
  expect_refused([](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
                 {"model.continuing_subword_prefix"});
  expect_refused([](Json& j) { j["normalizer"]["type"] = "BertNormalizer"; },
                 {"'normalizer.type'", "BertNormalizer"});
  // Without a ByteLevel pre-tokenizer the vocabulary would be read as text, which its
  // ByteLevel decoder contradicts.
  expect_refused([](Json& j) { j["pre_tokenizer"]["type"] = "Metaspace"; },
                 {"decoder", "ByteLevel", "pre_tokenizer"});
  expect_refused([](Json& j) { j["pre_tokenizer"] = Json(); }, {"pre_tokenizer"});
  expect_refused([](Json& j) { j["pre_tokenizer"]["type"] = "Whitespace"; },
                 {"'pre_tokenizer.type'", "Whitespace"});
  expect_refused([](Json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; },
                 {"pre_tokenizer.add_prefix_space"});
  expect_refused(
      [](Json& j) {
        Json split = Json::object();
        split["type"] = "Split";
        split["pattern"]["Regex"] = "[\\S]";  // \S inside a class
        split["behavior"] = "Isolated";
        Json bl = Json::parse(j["pre_tokenizer"].dump());
        bl["use_regex"] = false;
        Json seq = Json::object();
        seq["type"] = "Sequence";
        seq["pretokenizers"] = Json(Json::Array{split, bl});
        j["pre_tokenizer"] = seq;
      },
      {"pre_tokenizer.pretokenizers[0].pattern.Regex", "[\\\\S]"});
  expect_refused([](Json& j) { j["decoder"]["type"] = "WordPiece"; }, {"'decoder.type'"});
  expect_refused([](Json& j) { j["truncation"]["max_length"] = 8; }, {"truncation"});
  expect_refused([](Json& j) { j["added_tokens"].as_array()[0]["single_word"] = "yes"; },
                 {"'added_tokens[0].single_word'", "true or false"});
}

// A component deep in a Sequence is named by its path.
TEST(HfTokenizerBad, UnsupportedComponentsInSequencesNameTheirPath) {
  auto component = [](const char* type) {
    Json c = Json::object();
    c["type"] = type;
    return c;
  };
  expect_refused(
      [&](Json& j) {
        Json seq = component("Sequence");
        seq["normalizers"] =
            Json(Json::Array{component("NFC"), component("NFKC"), component("Lowercase")});
        j["normalizer"] = seq;
      },
      {"'normalizer.normalizers[2].type'", "Lowercase"});
  expect_refused(
      [&](Json& j) {
        Json seq = component("Sequence");
        seq["decoders"] = Json(Json::Array{component("Fuse"), component("CTC")});
        j["decoder"] = seq;
      },
      {"'decoder.decoders[1].type'", "CTC"});
  expect_refused([&](Json& j) { j["post_processor"] = component("BertProcessing"); },
                 {"'post_processor.type'", "BertProcessing"});
  expect_refused(
      [&](Json& j) {
        Json t = component("TemplateProcessing");
        Json special = Json::object(), text = Json::object();
        special["SpecialToken"]["id"] = "<nope>";
        text["Sequence"]["id"] = "A";
        t["single"] = Json(Json::Array{special, text});
        j["post_processor"] = t;
      },
      {"post_processor", "<nope>"});
}

TEST(HfTokenizerBad, InconsistentVocabulariesAreRefused) {
  expect_refused([](Json& j) { j["model"]["merges"].push_back("Ġthe Ġzzzqqq"); },
                 {"not in the vocabulary"});
  expect_refused([](Json& j) { j["model"]["merges"].push_back("a b c"); },
                 {"model.merges[50000]", "one space"});
  expect_refused([](Json& j) { j["model"]["vocab"]["a b"] = 60000; },
                 {"'model.vocab' token \"a b\"", "byte-level alphabet"});
  expect_refused([](Json& j) { j["model"]["vocab"]["Ġzz"] = 999999999; }, {"id 999999999"});
  expect_refused([](Json& j) { j["model"]["vocab"]["Ġzz"] = -3; }, {"Ġzz", "integer id"});
  expect_refused([](Json& j) { j["model"]["vocab"]["Ġzz"] = 64; }, {"id 64 twice"});
  expect_refused(
      [](Json& j) {
        Json a = Json::parse(j["added_tokens"].as_array()[0].dump());  // a copy, not a share
        a["content"] = "<|new|>";
        a["id"] = 100;  // an ordinary token's id
        j["added_tokens"].push_back(a);
      },
      {"<|new|>", "id 100"});
  expect_refused([](Json& j) { j["model"].as_object().erase("merges"); }, {"model.merges"});
  expect_refused([](Json& j) { j.as_object().erase("model"); }, {"missing field 'model'"});
}

TEST(HfTokenizerBad, MalformedJsonNamesTheFileLineAndColumn) {
  loom::test::TempDir tmp("hftok_bad");
  write_file_atomic(tmp / "tokenizer.json", "{\n  \"model\": {\"type\": \"BPE\",,}\n}\n");
  try {
    load_hf_tokenizer(tmp.path);
    FAIL() << "malformed JSON loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json:2:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_hf_tokenizer(tmp / "missing.json"), Error);
}
