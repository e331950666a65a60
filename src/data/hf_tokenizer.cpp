#include "data/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "data/chat.h"
#include "data/hf_components.h"
#include "data/hf_pipeline.h"
#include "data/normalize.h"
#include "data/spm_tokenizer.h"
#include "data/tokenizer_files.h"

namespace loom::data {

namespace {

namespace fs = std::filesystem;

// The Split regexes Loom's scanners reproduce exactly (pretokenize.h), as tokenizer.json spells
// them (Llama 3's is cl100k_base's).
constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr const char* kCl100kRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Returns model.type ("BPE" or "Unigram"); *byte_fallback is model.byte_fallback.
std::string check_model_options(const HfField& m, const std::string& where, bool* byte_fallback) {
  std::string type = m.type(where);
  if (type.empty()) type = "BPE";
  LOOM_CHECK(type == "BPE" || type == "Unigram", where, ": '", m.sub("type"), "' ",
             Json(type).dump(), " is not supported (Loom reads BPE and Unigram models)");
  *byte_fallback = m.boolean("byte_fallback", false, where);
  if (type == "Unigram") return type;
  if (m.has("dropout")) {
    double d = 0;
    try {
      d = m.j.at("dropout").as_double();
    } catch (const Error& e) {
      fail(where, ": 'model.dropout': ", e.what());
    }
    LOOM_CHECK(d == 0, where, ": 'model.dropout' ", d, " is not supported (BPE dropout)");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.has(k))
      LOOM_CHECK(m.at(k, where).str(where).empty(), where, ": 'model.", k, "' ", m.j.at(k).dump(),
                 " is not supported (BPE without word prefixes or suffixes)");
  return type;
}

// A Unigram model.vocab: [[piece, score], ...], ids in order.
void read_unigram_vocab(const HfField& model, const std::string& where,
                        std::vector<std::string>* tokens, std::vector<double>* scores) {
  HfField vocab = model.list("vocab", where);
  for (size_t i = 0; i < vocab.j.size(); ++i) {
    HfField e = vocab.item(i);
    LOOM_CHECK(e.j.is_array() && e.j.size() == 2 && e.j.as_array()[0].is_string() &&
                   e.j.as_array()[1].is_number(),
               where, ": '", e.path, "' must be [piece, score]");
    const std::string& piece = e.j.as_array()[0].as_string();
    LOOM_CHECK(!piece.empty(), where, ": '", e.path, "' has an empty piece");
    tokens->push_back(piece);
    scores->push_back(e.j.as_array()[1].as_double());
  }
  LOOM_CHECK(!tokens->empty(), where, ": '", vocab.path, "' is empty");
}

struct Added {
  std::string content;
  int32_t id;
  bool lstrip, rstrip, single_word, normalized, special;
};

std::vector<Added> parse_added_tokens(const HfField& root, const std::string& where) {
  std::vector<Added> out;
  if (!root.has("added_tokens")) return out;
  HfField list = root.at("added_tokens", where);
  LOOM_CHECK(list.j.is_array(), where, ": 'added_tokens' must be an array");
  std::set<std::string> seen;
  for (size_t i = 0; i < list.j.size(); ++i) {
    HfField t = list.item(i);
    LOOM_CHECK(t.j.is_object(), where, ": '", t.path, "' must be an object");
    const std::string content = t.at("content", where).str(where);
    LOOM_CHECK(!content.empty(), where, ": '", t.sub("content"), "' is empty");
    int64_t id = 0;
    try {
      id = t.at("id", where).j.as_int(0, INT32_MAX - 1);
    } catch (const Error& e) {
      fail(where, ": '", t.sub("id"), "': ", e.what());
    }
    // Hugging Face's default: a token that is not special is matched in the normalized text.
    const bool special = t.boolean("special", false, where);
    LOOM_CHECK(seen.insert(content).second, where, ": '", t.path, "' repeats the token '", content,
               "'");
    out.push_back({content, int32_t(id), t.boolean("lstrip", false, where),
                   t.boolean("rstrip", false, where), t.boolean("single_word", false, where),
                   t.boolean("normalized", !special, where), special});
  }
  return out;
}

std::string jsonl_quote(const std::string& s) {
  return Json(s).dump();
}

}  // namespace

namespace {

// The byte-level pre-tokenisations Loom's own scanners run (no PCRE2, no pipeline): ByteLevel
// with GPT-2's regex, or a Split on one of the known regexes then ByteLevel without one, after
// no normalizer or NFC alone.
std::optional<PreTokenizer> scanner_for(const HfComponents& c, bool* nfc) {
  *nfc = c.normalizers.size() == 1 && c.normalizers[0].kind == HfNormalizer::Kind::Nfc;
  if (!c.normalizers.empty() && !*nfc) return std::nullopt;
  const auto& p = c.pre_tokenizers;
  using K = HfPreTokenizer::Kind;
  if (p.size() == 1 && p[0].kind == K::ByteLevel && p[0].use_regex) return PreTokenizer::Gpt2;
  if (p.size() != 2 || p[0].kind != K::Split || p[1].kind != K::ByteLevel || p[1].use_regex ||
      p[0].behavior != HfPreTokenizer::Behavior::Isolated || c.splits[0].is_string)
    return std::nullopt;
  const std::string& re = c.splits[0].regex;
  if (re == kGpt2Regex) return PreTokenizer::Gpt2;
  if (re == kCl100kRegex) return PreTokenizer::Cl100k;
  if (re == kQwen2Regex) return PreTokenizer::Qwen2;
  return std::nullopt;
}

// The characters other than ▁ that some token has right before a ▁ (Gemma 3's ">▁</").
std::vector<std::string> chars_before_space_mark(const std::vector<std::string>& tokens) {
  constexpr std::string_view kMark = "\u2581";
  std::set<std::string> found;
  for (const std::string& t : tokens) {
    for (size_t at = t.find(kMark, 1); at != std::string::npos; at = t.find(kMark, at + 1)) {
      size_t k = at - 1;
      while (k > 0 && (uint8_t(t[k]) & 0xC0) == 0x80) --k;
      if (t.compare(k, at - k, kMark) != 0) found.insert(t.substr(k, at - k));
    }
  }
  return {found.begin(), found.end()};
}

}  // namespace

BpeTokenizer hf_tokenizer_from_json(const Json& j, const std::string& where) {
  LOOM_CHECK(j.is_object(), where, ": expected a JSON object (a Hugging Face tokenizer.json)");
  HfField root{j, ""};
  LOOM_CHECK(root.has("model"), where,
             ": missing field 'model' (not a Hugging Face tokenizer.json)");
  HfField model = root.at("model", where);
  bool byte_fallback = false;
  const bool unigram = check_model_options(model, where, &byte_fallback) == "Unigram";
  if (root.has("truncation"))
    fail(where, ": 'truncation' is set; Loom encodes whole texts (write null)");
  HfComponents comp = parse_hf_components(j, where);
  // A ByteLevel pre-tokenizer makes the vocabulary byte-level (its strings spell bytes);
  // without one, tokens are text (SentencePiece-style).
  bool byte_level = false;
  for (const HfPreTokenizer& p : comp.pre_tokenizers)
    byte_level |= p.kind == HfPreTokenizer::Kind::ByteLevel;
  if (byte_level) {
    LOOM_CHECK(!unigram, where,
               ": a Unigram 'model' with a ByteLevel pre-tokenizer is not supported (Loom's "
               "Unigram models are SentencePiece-style: tokens are text)");
    LOOM_CHECK(!byte_fallback, where,
               ": 'model.byte_fallback' true with a ByteLevel pre-tokenizer is not supported "
               "(a byte-level vocabulary has every byte already)");
    LOOM_CHECK(comp.decoders.empty(), where,
               ": 'decoder' of a byte-level vocabulary must be ByteLevel alone");
  } else {
    LOOM_CHECK(!comp.byte_level_decoder, where,
               ": 'decoder' ByteLevel needs a ByteLevel step in 'pre_tokenizer' (without one the "
               "vocabulary is not byte-level)");
  }
  const std::vector<Added> added = parse_added_tokens(root, where);
  std::map<std::string, int32_t> added_id;
  for (const Added& a : added) added_id[a.content] = a.id;

  // Vocabulary: strings -> ids. An added token may sit in it under its own text (GPT-2's
  // <|endoftext|>, or a token outside the alphabet): it becomes special, not ordinary.
  std::vector<std::string> tokens;
  std::vector<double> scores;  // Unigram
  if (unigram) {
    read_unigram_vocab(model, where, &tokens, &scores);
    std::map<std::string, size_t> piece_id;
    for (size_t i = 0; i < tokens.size(); ++i) piece_id.emplace(tokens[i], i);
    for (const Added& a : added) {
      LOOM_CHECK(size_t(a.id) >= tokens.size() || tokens[size_t(a.id)] == a.content, where,
                 ": added token ", jsonl_quote(a.content), " has id ", a.id,
                 ", which 'model.vocab' gives to ", jsonl_quote(tokens[size_t(a.id)]));
      const auto in_vocab = piece_id.find(a.content);
      LOOM_CHECK(in_vocab == piece_id.end() || in_vocab->second == size_t(a.id), where,
                 ": added token ", jsonl_quote(a.content), " has id ", a.id,
                 " but 'model.vocab' gives it ", in_vocab->second);
    }
    size_t max_id = tokens.size() - 1;
    for (const Added& a : added) max_id = std::max(max_id, size_t(a.id));
    check_id_bound(max_id, tokens.size() + added.size(), where);
    std::set<std::string> seen;
    for (size_t i = 0; i < tokens.size(); ++i)
      LOOM_CHECK(seen.insert(tokens[i]).second, where, ": 'model.vocab[", i,
                 "]' repeats the piece ", jsonl_quote(tokens[i]));
  }
  static const Json kNoVocab = Json::object();
  const HfField vocab = unigram ? HfField{kNoVocab, "model.vocab"} : model.at("vocab", where);
  // A token's string as Loom stores it: bytes for a byte-level vocabulary, else the text.
  auto decode_token = [&](std::string_view text, std::string* out) {
    if (byte_level) return byte_level_decode(text, out);
    out->assign(text);
    return true;
  };
  if (!unigram) {
    LOOM_CHECK(vocab.j.is_object(), where, ": 'model.vocab' must be an object of token -> id");
    size_t max_id = 0;
    for (const auto& [text, idj] : vocab.j.as_object()) {
      LOOM_CHECK(idj.type() == Json::Type::Int && idj.as_int() >= 0 && idj.as_int() < INT32_MAX,
                 where, ": 'model.vocab' token ", jsonl_quote(text), " has no valid integer id");
      max_id = std::max(max_id, size_t(idj.as_int()));
    }
    for (const Added& a : added) max_id = std::max(max_id, size_t(a.id));
    check_id_bound(max_id, vocab.j.size() + added.size(), where);
    std::string bytes;
    for (const auto& [text, idj] : vocab.j.as_object()) {
      const auto id = size_t(idj.as_int());
      auto a = added_id.find(text);
      const bool decoded = decode_token(text, &bytes);
      if (a != added_id.end() || (decoded && added_id.count(bytes))) {
        const int32_t want = a != added_id.end() ? a->second : added_id.at(bytes);
        LOOM_CHECK(want == int32_t(id), where, ": added token ", jsonl_quote(text), " has id ",
                   want, " but 'model.vocab' gives it ", id);
        // A byte-level special token's slot stays empty among the ordinary ones. In a
        // SentencePiece-style vocabulary it stays a token BPE can make as well (Gemma's runs of
        // ▁ are both), as in transformers.js.
        if (byte_level) continue;
      }
      LOOM_CHECK(decoded, where, ": 'model.vocab' token ", jsonl_quote(text),
                 " is not in the byte-level alphabet");
      if (tokens.size() <= id) tokens.resize(id + 1);
      LOOM_CHECK(tokens[id].empty(), where, ": 'model.vocab' uses id ", id, " twice");
      tokens[id] = bytes;
    }
  }
  SpecialTokens specials;
  for (const Added& a : added) {
    LOOM_CHECK(
        size_t(a.id) >= tokens.size() || tokens[size_t(a.id)].empty() ||
            (!byte_level && tokens[size_t(a.id)] == a.content),
        where, ": added token ", jsonl_quote(a.content), " has id ", a.id,
        ", which 'model.vocab' gives to ",
        jsonl_quote(byte_level ? byte_level_encode(tokens[size_t(a.id)]) : tokens[size_t(a.id)]));
    specials.emplace_back(a.content, a.id);
  }

  // Merges: "a b" strings (the classic form) or ["a", "b"] pairs (tokenizers 0.20+).
  static const Json kNoMerges = Json::array();
  HfField merges_f = unigram ? HfField{kNoMerges, "model.merges"} : model.at("merges", where);
  LOOM_CHECK(merges_f.j.is_array(), where, ": 'model.merges' must be an array");
  std::set<std::string> special_bytes;
  for (const Added& a : added) special_bytes.insert(a.content);
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_f.j.size());
  for (size_t k = 0; k < merges_f.j.size(); ++k) {
    const Json& m = merges_f.j.as_array()[k];
    std::string_view l, r;
    if (m.is_string()) {
      const std::string& s = m.as_string();
      size_t sp = s.find(' ');
      LOOM_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
                     s.find(' ', sp + 1) == std::string::npos,
                 where, ": 'model.merges[", k, "]' ", jsonl_quote(s),
                 " must be two tokens separated by one space");
      l = std::string_view(s).substr(0, sp);
      r = std::string_view(s).substr(sp + 1);
    } else {
      LOOM_CHECK(m.is_array() && m.size() == 2 && m.as_array()[0].is_string() &&
                     m.as_array()[1].is_string(),
                 where, ": 'model.merges[", k, "]' must be \"a b\" or [\"a\", \"b\"]");
      l = m.as_array()[0].as_string();
      r = m.as_array()[1].as_string();
    }
    std::string a, b;
    LOOM_CHECK(decode_token(l, &a) && decode_token(r, &b), where, ": 'model.merges[", k,
               "]' has a token outside the byte-level alphabet");
    // A merge that makes a byte-level added token never applies to text (added tokens are
    // cut out first); it is dropped, since that token is not an ordinary one here.
    if (byte_level &&
        (special_bytes.count(a + b) || special_bytes.count(a) || special_bytes.count(b)))
      continue;
    merges.emplace_back(std::move(a), std::move(b));
  }
  const bool ignore_merges = model.boolean("ignore_merges", false, where);

  // Added tokens matched in normalized text, by their text as the normalizers write it (without
  // a normalizer, in the raw text, which is the same).
  std::map<int32_t, std::string> normalized_pattern;
  if (!comp.normalizers.empty()) {
    HfPipeline norm;
    norm.normalizers = comp.normalizers;
    for (const Added& a : added)
      if (a.normalized) normalized_pattern[a.id] = norm.normalize(a.content);
  }
  bool lr_strip = !normalized_pattern.empty();
  for (const Added& a : added) lr_strip |= a.lstrip || a.rstrip || a.single_word;
  bool nfc_only = false;
  const std::optional<PreTokenizer> scanner =
      lr_strip ? std::nullopt : scanner_for(comp, &nfc_only);
  LOOM_CHECK(!nfc_only || nfc_available(), where, ": normalizer NFC needs utf8proc, which this ",
             "build did not find (scripts/setup.sh installs libutf8proc-dev)");

  auto id_of = [&](const std::string& name, const std::string& field) {
    if (auto a = added_id.find(name); a != added_id.end()) return a->second;
    if (vocab.j.contains(name)) return int32_t(vocab.j.at(name).as_int());
    if (unigram)
      if (auto it = std::find(tokens.begin(), tokens.end(), name); it != tokens.end())
        return int32_t(it - tokens.begin());
    fail(where, ": '", field, "' names the token ", jsonl_quote(name),
         ", which is neither an added token nor in 'model.vocab'");
  };
  std::shared_ptr<HfPipeline> pipe;
  if (!scanner || !comp.prefix.empty() || !comp.suffix.empty()) {
    pipe = std::make_shared<HfPipeline>();
    pipe->runs_encode = !scanner;
    pipe->char_model = !byte_level;
    pipe->byte_fallback = byte_fallback;
    if (pipe->runs_encode) {
      compile_hf_splits(comp, where);
      pipe->normalizers = std::move(comp.normalizers);
      pipe->pre_tokenizers = std::move(comp.pre_tokenizers);
    }
    pipe->decoders = std::move(comp.decoders);
    for (const std::string& t : comp.prefix) pipe->prefix.push_back(id_of(t, "post_processor"));
    for (const std::string& t : comp.suffix) pipe->suffix.push_back(id_of(t, "post_processor"));
    if (unigram && model.has("unk_id")) {
      try {
        pipe->unk_id = int32_t(model.j.at("unk_id").as_int(0, int64_t(tokens.size()) - 1));
      } catch (const Error& e) {
        fail(where, ": '", model.sub("unk_id"), "': ", e.what());
      }
    } else if (!unigram && model.has("unk_token")) {
      pipe->unk_id = id_of(model.at("unk_token", where).str(where), "model.unk_token");
    }
    for (const Added& a : added) {
      if (a.lstrip) pipe->lstrip_ids.push_back(a.id);
      if (a.rstrip) pipe->rstrip_ids.push_back(a.id);
      if (a.single_word) pipe->single_word_ids.push_back(a.id);
      if (a.special) pipe->special_ids.push_back(a.id);
      if (auto p = normalized_pattern.find(a.id);
          p != normalized_pattern.end() && !p->second.empty())
        pipe->normalized_added.emplace_back(p->second, a.id);
    }
    if (!byte_level && !unigram) pipe->joins_space_mark = chars_before_space_mark(tokens);
    pipe->source = j.dump();
  }
  try {
    if (unigram)
      return BpeTokenizer::from_unigram(std::move(tokens), std::move(scores), std::move(specials),
                                        std::move(pipe));
    BpeTokenizer t =
        BpeTokenizer::from_merges(std::move(tokens), merges, scanner.value_or(PreTokenizer::Gpt2),
                                  std::move(specials), ignore_merges, std::move(pipe));
    t.set_nfc(scanner && nfc_only);
    return t;
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
}

BpeTokenizer load_hf_tokenizer(const std::string& path) {
  std::string file = path;
  if (fs::is_directory(path)) file = (fs::path(path) / "tokenizer.json").string();
  return hf_tokenizer_from_json(Json::parse(read_file(file), file), file);
}

Json hf_tokenizer_json(const BpeTokenizer& tok) {
  LOOM_CHECK(!tok.backend(),
             "a SentencePiece tokenizer.model has no tokenizer.json form in Loom: "
             "save_hf_tokenizer writes the model file itself");
  if (tok.hf_pipeline()) return Json::parse(tok.hf_pipeline()->source);  // as it was read
  Json j = Json::object();
  j["version"] = "1.0";
  j["truncation"] = Json();
  j["padding"] = Json();
  std::vector<std::pair<int32_t, std::string>> sp;
  for (const auto& [text, id] : tok.specials()) sp.emplace_back(id, text);
  std::sort(sp.begin(), sp.end());
  Json added = Json::array();
  for (const auto& [id, text] : sp) {
    Json a = Json::object();
    a["id"] = int64_t(id);
    a["content"] = text;
    a["single_word"] = false;
    a["lstrip"] = false;
    a["rstrip"] = false;
    a["normalized"] = false;
    a["special"] = true;
    added.push_back(std::move(a));
  }
  j["added_tokens"] = std::move(added);
  if (tok.nfc()) {
    Json n = Json::object();
    n["type"] = "NFC";
    j["normalizer"] = std::move(n);
  } else {
    j["normalizer"] = Json();
  }
  auto byte_level = [](bool use_regex) {
    Json b = Json::object();
    b["type"] = "ByteLevel";
    b["add_prefix_space"] = false;
    b["trim_offsets"] = true;
    b["use_regex"] = use_regex;
    return b;
  };
  if (tok.pretokenizer() == PreTokenizer::Gpt2) {
    j["pre_tokenizer"] = byte_level(true);
  } else {
    Json split = Json::object();
    split["type"] = "Split";
    split["pattern"]["Regex"] =
        tok.pretokenizer() == PreTokenizer::Cl100k ? kCl100kRegex : kQwen2Regex;
    split["behavior"] = "Isolated";
    split["invert"] = false;
    Json seq = Json::object();
    seq["type"] = "Sequence";
    seq["pretokenizers"] = Json(Json::Array{std::move(split), byte_level(false)});
    j["pre_tokenizer"] = std::move(seq);
  }
  j["post_processor"] = Json();
  j["decoder"] = byte_level(true);
  Json model = Json::object();
  model["type"] = "BPE";
  model["dropout"] = Json();
  model["unk_token"] = Json();
  model["continuing_subword_prefix"] = Json();
  model["end_of_word_suffix"] = Json();
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = tok.takes_whole_pieces();
  Json vocab = Json::object();
  for (size_t id = 0; id < tok.n_ordinary(); ++id)
    if (!tok.token_bytes(int32_t(id)).empty())
      vocab[byte_level_encode(tok.token_bytes(int32_t(id)))] = int64_t(id);
  model["vocab"] = std::move(vocab);
  Json merges = Json::array();
  for (const auto& [l, r] : tok.merge_list())
    merges.push_back(byte_level_encode(tok.token_bytes(l)) + " " +
                     byte_level_encode(tok.token_bytes(r)));
  model["merges"] = std::move(merges);
  j["model"] = std::move(model);
  return j;
}

HfSpecialIds hf_special_ids(const BpeTokenizer& tok, const std::string& chat) {
  HfSpecialIds ids;
  if (!chat.empty()) {
    const std::string bot = ChatTemplate::begin_of_text_token(chat);
    if (!bot.empty()) ids.bos = tok.special_id(bot);
    const int32_t eot = tok.special_id(ChatTemplate::end_of_turn_token(chat));
    if (eot >= 0) ids.eos.push_back(eot);
  }
  if (tok.eot_id() >= 0) {
    ids.eos.push_back(tok.eot_id());
    if (ids.bos < 0 && chat.empty()) ids.bos = tok.eot_id();  // GPT-2's convention
  }
  if (tok.backend()) {  // a SentencePiece model: its <s> and </s>
    if (ids.bos < 0 && !tok.hf_pipeline()->prefix.empty()) ids.bos = tok.hf_pipeline()->prefix[0];
    if (const int32_t eos = tok.special_id("</s>"); eos >= 0) ids.eos.push_back(eos);
  }
  return ids;
}

Json hf_tokenizer_config_json(const BpeTokenizer& tok, const std::string& chat,
                              int64_t model_max_length) {
  Json c = Json::object();
  Json decoder = Json::object();
  for (const auto& [text, id] : tok.specials()) {
    Json a = Json::object();
    a["content"] = text;
    a["lstrip"] = false;
    a["normalized"] = false;
    a["rstrip"] = false;
    a["single_word"] = false;
    a["special"] = true;
    decoder[std::to_string(id)] = std::move(a);
  }
  c["added_tokens_decoder"] = std::move(decoder);
  const HfSpecialIds ids = hf_special_ids(tok, chat);
  auto text_of = [&](int32_t id) {
    if (id < 0) return Json();
    for (const auto& [text, sid] : tok.specials())  // as written (SentencePiece decodes <s> to "")
      if (sid == id) return Json(text);
    return Json(tok.decode({&id, 1}));
  };
  c["bos_token"] = text_of(ids.bos);
  c["eos_token"] = text_of(ids.eos.empty() ? -1 : ids.eos.front());
  c["pad_token"] = text_of(tok.eot_id());
  if (!chat.empty()) c["chat_template"] = ChatTemplate::jinja(chat);
  c["clean_up_tokenization_spaces"] = false;
  c["model_max_length"] = model_max_length;
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  if (tok.backend()) {  // tokenizer.model: read by the SentencePiece tokenizer class
    c["tokenizer_class"] = "LlamaTokenizer";
    c["add_bos_token"] = ids.bos >= 0;
    c["add_eos_token"] = false;
    c["legacy"] = true;
    const HfPipeline* hf = tok.hf_pipeline();
    if (hf && hf->unk_id >= 0) c["unk_token"] = text_of(hf->unk_id);
  }
  return c;
}

void save_hf_tokenizer(const BpeTokenizer& tok, const std::string& dir, const std::string& chat,
                       int64_t model_max_length) {
  const Json config = hf_tokenizer_config_json(tok, chat, model_max_length);  // checks `chat`
  make_dirs(dir);
  if (tok.backend())
    write_file_atomic((fs::path(dir) / "tokenizer.model").string(), spm_model_bytes(tok));
  else
    write_file_atomic((fs::path(dir) / "tokenizer.json").string(),
                      hf_tokenizer_json(tok).dump(2) + "\n");
  write_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), config.dump(2) + "\n");
}

}  // namespace loom::data
