// Shared by the tokenizer.json tests: the reference cases and GPT-2's vocabulary written as a
// Hugging Face tokenizer.json the way the Hub's gpt2 has it (built here from encoder.json and
// vocab.bpe, independently of Loom's own writer).
#pragma once

#include <string>
#include <vector>

#include "core/fs.h"
#include "core/json.h"

namespace loom::test {

inline const std::string kTokDir = std::string(LOOM_DATA_FIXTURES) + "/tokenizers";

struct TokCase {
  std::string text;
  std::vector<int32_t> gpt2, cl100k;
};

inline const std::vector<TokCase>& tok_cases() {
  static const std::vector<TokCase> all = [] {
    auto ids = [](const Json& a) {
      std::vector<int32_t> v;
      for (const Json& x : a.as_array()) v.push_back(int32_t(x.as_int()));
      return v;
    };
    std::vector<TokCase> out;
    const std::string text = read_file(kTokDir + "/cases.jsonl");
    for (size_t pos = 0; pos < text.size();) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      if (eol > pos) {
        Json j = Json::parse(std::string_view(text).substr(pos, eol - pos), "cases.jsonl");
        out.push_back({j.at("text").as_string(), ids(j.at("gpt2")), ids(j.at("cl100k_base"))});
      }
      pos = eol + 1;
    }
    return out;
  }();
  return all;
}

// merges_as_pairs: ["a", "b"] (tokenizers 0.20+) instead of "a b".
inline Json gpt2_tokenizer_json(bool merges_as_pairs) {
  Json j = Json::object();
  j["version"] = "1.0";
  j["truncation"] = Json();
  j["padding"] = Json();
  Json eot = Json::object();
  eot["id"] = 50256;
  eot["content"] = "<|endoftext|>";
  eot["single_word"] = false;
  eot["lstrip"] = false;
  eot["rstrip"] = false;
  eot["normalized"] = true;
  eot["special"] = true;
  j["added_tokens"] = Json(Json::Array{eot});
  j["normalizer"] = Json();
  auto byte_level = [] {  // a new object each time (Json copies share their contents)
    Json bl = Json::object();
    bl["type"] = "ByteLevel";
    bl["add_prefix_space"] = false;
    bl["trim_offsets"] = true;
    bl["use_regex"] = true;
    return bl;
  };
  j["pre_tokenizer"] = byte_level();
  j["post_processor"] = byte_level();
  j["decoder"] = byte_level();
  Json m = Json::object();
  m["type"] = "BPE";
  m["dropout"] = Json();
  m["unk_token"] = Json();
  m["continuing_subword_prefix"] = "";
  m["end_of_word_suffix"] = "";
  m["fuse_unk"] = false;
  m["byte_fallback"] = false;
  m["vocab"] = Json::parse(read_file(kTokDir + "/gpt2/encoder.json"), "encoder.json");
  Json merges = Json::array();
  const std::string bpe = read_file(kTokDir + "/gpt2/vocab.bpe");
  for (size_t pos = 0; pos < bpe.size();) {
    size_t eol = bpe.find('\n', pos);
    if (eol == std::string::npos) eol = bpe.size();
    std::string line = bpe.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ');
    if (merges_as_pairs)
      merges.push_back(Json(Json::Array{Json(line.substr(0, sp)), Json(line.substr(sp + 1))}));
    else
      merges.push_back(line);
  }
  m["merges"] = std::move(merges);
  j["model"] = std::move(m);
  return j;
}

}  // namespace loom::test
