// Reads the normalizer, pre_tokenizer, decoder and post_processor of a tokenizer.json into
// an HfPipeline's steps. Every refusal names the component's path in the file
// (`normalizer.normalizers[2].type`).
#pragma once

#include <string>

#include "core/json.h"
#include "data/hf_pipeline.h"

namespace loom::data {

// Field access with errors that name the field's path in the file.
struct HfField {
  const Json& j;
  std::string path;  // e.g. "model.vocab"

  bool has(const char* k) const { return j.is_object() && j.contains(k) && !j.at(k).is_null(); }
  HfField at(const char* k, const std::string& where) const;
  HfField item(size_t i) const { return {j.as_array()[i], path + "[" + std::to_string(i) + "]"}; }
  std::string sub(const char* k) const { return path.empty() ? k : path + "." + k; }
  std::string str(const std::string& where) const;
  bool boolean(const char* k, bool dflt, const std::string& where) const;
  // The "type" of a component object (empty when absent).
  std::string type(const std::string& where) const;
  // The items of the array field `k`.
  HfField list(const char* k, const std::string& where) const;
};

// A Split pre-tokenizer as read, before its regex is compiled (Loom's own scanners run the
// regexes they know without PCRE2).
struct HfSplitSpec {
  std::string regex;  // a String pattern is quoted into one
  bool is_string = false;
  std::string path;  // "pre_tokenizer.pretokenizers[0].pattern.Regex"
};

struct HfComponents {
  std::vector<HfNormalizer> normalizers;
  std::vector<HfPreTokenizer> pre_tokenizers;  // Split's regex not yet compiled
  std::vector<HfSplitSpec> splits;             // one per Split, in order
  std::vector<HfDecoder> decoders;
  bool byte_level_decoder = false;
  // TemplateProcessing's token names before and after the text ("single").
  std::vector<std::string> prefix, suffix;
};

HfComponents parse_hf_components(const Json& root, const std::string& where);
// Compiles the Split regexes (needs PCRE2) into c.pre_tokenizers.
void compile_hf_splits(HfComponents& c, const std::string& where);

}  // namespace loom::data
