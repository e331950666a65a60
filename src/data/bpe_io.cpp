// Tokenizer files: GPT-2's encoder.json + vocab.bpe, tiktoken rank files, Loom's own folder.
#include <algorithm>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "data/bpe.h"

#include "data/hf_pipeline.h"
#include "data/hf_tokenizer.h"
#include "data/spm_tokenizer.h"
#include "data/tokenizer_files.h"

namespace loom::data {

namespace {

namespace fs = std::filesystem;

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    int v = b64_value(in[i]);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(char((acc >> bits) & 0xFF));
    }
  }
  for (; i < in.size(); ++i)
    if (in[i] != '=') return false;
  return in.size() % 4 == 0;
}

std::string base64_encode(std::string_view in) {
  static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v =
        (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out.push_back(tbl[(v >> k) & 63]);
  }
  if (size_t rest = in.size() - i) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out.push_back(tbl[(v >> 18) & 63]);
    out.push_back(tbl[(v >> 12) & 63]);
    out.push_back(rest == 2 ? tbl[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

SpecialTokens specials_from_json(const Json& obj, const std::string& where) {
  SpecialTokens out;
  for (auto& [text, id] : obj.as_object()) {
    LOOM_CHECK(id.type() == Json::Type::Int, where, ": special token '", text,
               "' needs an integer id");
    out.emplace_back(text, int32_t(id.as_int()));
  }
  return out;
}

}  // namespace

BpeTokenizer load_gpt2_tokenizer(const std::string& dir) {
  std::string enc_path = (fs::path(dir) / "encoder.json").string();
  std::string bpe_path = (fs::path(dir) / "vocab.bpe").string();
  Json enc = Json::parse(read_file(enc_path), enc_path);
  LOOM_CHECK(enc.is_object(), enc_path, ": expected an object of token -> id");
  std::map<std::string, int32_t> by_text;  // raw bytes -> id
  std::vector<std::string> tokens;
  std::string bytes;
  size_t max_id = 0;
  for (auto& [text, idj] : enc.as_object()) {
    LOOM_CHECK(idj.type() == Json::Type::Int && idj.as_int() >= 0, enc_path, ": token '", text,
               "' has no valid integer id");
    max_id = std::max(max_id, size_t(idj.as_int()));
  }
  check_id_bound(max_id, enc.as_object().size(), enc_path);
  for (auto& [text, idj] : enc.as_object()) {
    LOOM_CHECK(byte_level_decode(text, &bytes), enc_path, ": token '", text,
               "' is not in GPT-2's byte encoding");
    auto id = size_t(idj.as_int());
    if (tokens.size() <= id) tokens.resize(id + 1);
    LOOM_CHECK(tokens[id].empty(), enc_path, ": id ", id, " used twice");
    tokens[id] = bytes;
    by_text[bytes] = int32_t(id);
  }

  std::string bpe = read_file(bpe_path);
  std::vector<std::pair<std::string, std::string>> merges;
  std::map<std::string, bool> made;  // bytes produced by some merge
  size_t line_no = 0;
  for (size_t pos = 0; pos < bpe.size();) {
    size_t eol = bpe.find('\n', pos);
    if (eol == std::string::npos) eol = bpe.size();
    std::string_view line(bpe.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t sp = line.find(' ');
    LOOM_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                   line.find(' ', sp + 1) == std::string_view::npos,
               bpe_path, ":", line_no, ": expected two tokens separated by one space");
    std::string a, b;
    LOOM_CHECK(
        byte_level_decode(line.substr(0, sp), &a) && byte_level_decode(line.substr(sp + 1), &b),
        bpe_path, ":", line_no, ": token not in GPT-2's byte encoding");
    made[a + b] = true;
    merges.emplace_back(std::move(a), std::move(b));
  }
  // Multi-byte entries that no merge produces (<|endoftext|>) are special tokens. Anything
  // else unproduced means merges are missing: vocab.bpe is cut short or from another model.
  auto special_like = [](const std::string& t) {
    return (t.front() == '<' && t.back() == '>') || (t.front() == '[' && t.back() == ']');
  };
  SpecialTokens specials;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].size() > 1 && !made.count(tokens[id])) {
      LOOM_CHECK(special_like(tokens[id]), bpe_path, ": no merge produces token ", id, " ('",
                 tokens[id], "') of ", enc_path, " (", merges.size(), " merges read over ", line_no,
                 " lines): the file is cut short or does not match encoder.json");
      specials.emplace_back(tokens[id], int32_t(id));
      tokens[id].clear();
    }
  }
  return BpeTokenizer::from_merges(std::move(tokens), merges, PreTokenizer::Gpt2,
                                   std::move(specials));
}

BpeTokenizer load_tiktoken(const std::string& path, PreTokenizer pre, SpecialTokens specials) {
  std::string text = read_file(path);
  struct Ranked {
    size_t rank, line_no;
    std::string bytes;
  };
  std::vector<Ranked> ranked;  // in file order
  std::string bytes;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    LOOM_CHECK(sp != std::string_view::npos, path, ":", line_no, ": expected 'base64-token rank'");
    LOOM_CHECK(base64_decode(line.substr(0, sp), &bytes) && !bytes.empty(), path, ":", line_no,
               ": invalid base64 token");
    std::string_view rank_s = line.substr(sp + 1);
    int64_t rank = 0;
    LOOM_CHECK(!rank_s.empty() && rank_s.size() < 10, path, ":", line_no, ": invalid rank");
    for (char c : rank_s) {
      LOOM_CHECK(c >= '0' && c <= '9', path, ":", line_no, ": invalid rank '", rank_s, "'");
      rank = rank * 10 + (c - '0');
    }
    ranked.push_back({size_t(rank), line_no, bytes});
  }
  LOOM_CHECK(!ranked.empty(), path, ": no tokens");
  size_t max_rank = 0;
  for (const Ranked& r : ranked) max_rank = std::max(max_rank, r.rank);
  check_id_bound(max_rank, ranked.size(), path);
  std::vector<std::string> tokens(max_rank + 1);
  for (Ranked& r : ranked) {
    LOOM_CHECK(tokens[r.rank].empty(), path, ":", r.line_no, ": rank ", r.rank, " used twice");
    tokens[r.rank] = std::move(r.bytes);
  }
  try {
    return BpeTokenizer::from_ranks(std::move(tokens), pre, std::move(specials));
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

BpeTokenizer load_tiktoken(const std::string& path) {
  std::string sidecar = path + ".json";
  if (file_exists(sidecar)) {
    Json j = Json::parse(read_file(sidecar), sidecar);
    PreTokenizer pre = parse_pretokenizer(
        j.contains("pretokenizer") ? j.at("pretokenizer").as_string() : std::string("gpt2"));
    SpecialTokens sp = j.contains("special_tokens")
                           ? specials_from_json(j.at("special_tokens"), sidecar)
                           : SpecialTokens{};
    return load_tiktoken(path, pre, std::move(sp));
  }
  std::string stem = fs::path(path).stem().string();
  if (stem == "gpt2" || stem == "r50k_base" || stem == "p50k_base")
    return load_tiktoken(path, PreTokenizer::Gpt2, {{"<|endoftext|>", 50256}});
  if (stem == "cl100k_base")
    return load_tiktoken(path, PreTokenizer::Cl100k,
                         {{"<|endoftext|>", 100257},
                          {"<|fim_prefix|>", 100258},
                          {"<|fim_middle|>", 100259},
                          {"<|fim_suffix|>", 100260},
                          {"<|endofprompt|>", 100276}});
  // Unknown file: GPT-2 rules, <|endoftext|> right after the last rank.
  BpeTokenizer probe = load_tiktoken(path, PreTokenizer::Gpt2, {});
  log_info(path, ": unknown tiktoken vocabulary; using gpt2 pre-tokenisation and <|endoftext|> = ",
           probe.vocab_size(), " (write ", sidecar, " to choose)");
  return load_tiktoken(path, PreTokenizer::Gpt2, {{"<|endoftext|>", probe.vocab_size()}});
}

std::string tiktoken_text(const BpeTokenizer& tok) {
  LOOM_CHECK(!tok.backend(),
             "a SentencePiece tokenizer.model cannot be written as a tiktoken "
             "file: use the model file itself");
  LOOM_CHECK(!tok.hf_pipeline() || !tok.hf_pipeline()->runs_encode,
             "this tokenizer runs tokenizer.json steps (normalizers, pre-tokenizers or a "
             "SentencePiece-style vocabulary) that a tiktoken file cannot hold: use its "
             "tokenizer.json");
  std::string out;
  for (size_t id = 0; id < tok.n_ordinary(); ++id) {
    const std::string& b = tok.token_bytes(int32_t(id));
    if (b.empty()) continue;
    out += base64_encode(b);
    out += ' ';
    out += std::to_string(id);
    out += '\n';
  }
  return out;
}

void save_loom_tokenizer(const BpeTokenizer& tok, const std::string& dir) {
  make_dirs(dir);
  write_file_atomic((fs::path(dir) / "tokenizer.tiktoken").string(), tiktoken_text(tok));
  Json meta = Json::object();
  meta["format"] = "loom-bpe-v1";
  meta["pretokenizer"] = pretokenizer_name(tok.pretokenizer());
  meta["vocab_size"] = int64_t(tok.vocab_size());
  Json sp = Json::object();
  for (auto& [text, id] : tok.specials()) sp[text] = int64_t(id);
  meta["special_tokens"] = sp;
  if (tok.nfc()) meta["normalizer"] = "nfc";
  write_file_atomic((fs::path(dir) / "tokenizer.json").string(), meta.dump(2) + "\n");
}

BpeTokenizer load_loom_tokenizer(const std::string& dir) {
  std::string meta_path = (fs::path(dir) / "tokenizer.json").string();
  Json meta = Json::parse(read_file(meta_path), meta_path);
  LOOM_CHECK(meta.contains("format") && meta.at("format").as_string() == "loom-bpe-v1", meta_path,
             ": not a Loom tokenizer (format must be loom-bpe-v1)");
  PreTokenizer pre = parse_pretokenizer(meta.at("pretokenizer").as_string());
  SpecialTokens sp = meta.contains("special_tokens")
                         ? specials_from_json(meta.at("special_tokens"), meta_path)
                         : SpecialTokens{};
  BpeTokenizer t =
      load_tiktoken((fs::path(dir) / "tokenizer.tiktoken").string(), pre, std::move(sp));
  if (meta.contains("normalizer")) {
    LOOM_CHECK(meta.at("normalizer").is_string() && meta.at("normalizer").as_string() == "nfc",
               meta_path, ": normalizer must be \"nfc\"");
    t.set_nfc(true);
  }
  return t;
}

std::unique_ptr<BpeTokenizer> load_tokenizer(const std::string& spec) {
  auto make = [](BpeTokenizer t) { return std::make_unique<BpeTokenizer>(std::move(t)); };
  size_t colon = spec.find(':');
  if (colon != std::string::npos) {
    std::string kind = spec.substr(0, colon), path = spec.substr(colon + 1);
    if (kind == "gpt2") return make(load_gpt2_tokenizer(path));
    if (kind == "tiktoken") return make(load_tiktoken(path));
    if (kind == "loom") return make(load_loom_tokenizer(path));
    if (kind == "hf") return make(load_hf_tokenizer(path));
    if (kind == "spm") return make(load_spm_tokenizer(path));
  }
  LOOM_CHECK(file_exists(spec), "tokenizer '", spec,
             "' not found (expected gpt2:DIR, tiktoken:FILE, loom:DIR, hf:PATH, spm:PATH or an "
             "existing path)");
  if (fs::is_directory(spec)) {
    if (file_exists((fs::path(spec) / "encoder.json").string()))
      return make(load_gpt2_tokenizer(spec));
    // Loom's own folder writes its ranks beside a small tokenizer.json; Hugging Face's has none.
    if (file_exists((fs::path(spec) / "tokenizer.tiktoken").string()))
      return make(load_loom_tokenizer(spec));
    if (file_exists((fs::path(spec) / "tokenizer.json").string()))
      return make(load_hf_tokenizer(spec));
    if (file_exists((fs::path(spec) / "tokenizer.model").string()))
      return make(load_spm_tokenizer(spec));
    fail(spec,
         ": folder has neither encoder.json + vocab.bpe (GPT-2), tokenizer.tiktoken + "
         "tokenizer.json (Loom), tokenizer.json (Hugging Face) nor tokenizer.model "
         "(SentencePiece)");
  }
  if (fs::path(spec).extension() == ".json") return make(load_hf_tokenizer(spec));
  if (fs::path(spec).extension() == ".model") return make(load_spm_tokenizer(spec));
  return make(load_tiktoken(spec));
}

}  // namespace loom::data
