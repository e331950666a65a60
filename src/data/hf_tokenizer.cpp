#include "data/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "data/chat.h"
#include "data/normalize.h"
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

// Field access with errors that name the field's path in the file.
struct Field {
  const Json& j;
  std::string path;  // e.g. "model.vocab"

  bool has(const char* k) const { return j.is_object() && j.contains(k) && !j.at(k).is_null(); }
  Field at(const char* k, const std::string& where) const {
    LOOM_CHECK(has(k), where, ": missing field '", sub(k), "'");
    return {j.at(k), sub(k)};
  }
  std::string sub(const char* k) const { return path.empty() ? k : path + "." + k; }
  std::string str(const std::string& where) const {
    LOOM_CHECK(j.is_string(), where, ": '", path, "' must be a string");
    return j.as_string();
  }
  bool boolean(const char* k, bool dflt, const std::string& where) const {
    if (!has(k)) return dflt;
    LOOM_CHECK(j.at(k).type() == Json::Type::Bool, where, ": '", sub(k), "' must be true or false");
    return j.at(k).as_bool();
  }
  std::string type(const std::string& where) const {
    LOOM_CHECK(j.is_object(), where, ": '", path, "' must be an object");
    return has("type") ? at("type", where).str(where) : std::string();
  }
};

// A ByteLevel pre-tokenizer: its use_regex (GPT-2's regex), after refusing add_prefix_space.
bool byte_level_use_regex(const Field& f, const std::string& where) {
  // Hugging Face's defaults: add_prefix_space and use_regex true when absent.
  LOOM_CHECK(!f.boolean("add_prefix_space", true, where), where, ": '", f.sub("add_prefix_space"),
             "' true is not supported (Loom encodes text as it is; GPT-2, Llama 3 and Qwen2 "
             "write false)");
  return f.boolean("use_regex", true, where);
}

PreTokenizer parse_pre_tokenizer(const Field& f, const std::string& where) {
  LOOM_CHECK(!f.j.is_null(), where,
             ": 'pre_tokenizer' is null: Loom needs byte-level "
             "pre-tokenisation (ByteLevel, or Split + ByteLevel)");
  const std::string type = f.type(where);
  if (type == "ByteLevel") {
    LOOM_CHECK(byte_level_use_regex(f, where), where,
               ": 'pre_tokenizer' ByteLevel without "
               "use_regex splits nothing, which no supported model does");
    return PreTokenizer::Gpt2;
  }
  LOOM_CHECK(type == "Sequence", where, ": pre_tokenizer type '", type,
             "' is not supported (ByteLevel, or a Sequence of Split and ByteLevel)");
  Field list = f.at("pretokenizers", where);
  LOOM_CHECK(list.j.is_array(), where, ": '", list.path, "' must be an array");
  const auto& items = list.j.as_array();
  if (items.size() == 1) return parse_pre_tokenizer({items[0], list.path + "[0]"}, where);
  LOOM_CHECK(items.size() == 2, where, ": '", list.path, "' has ", items.size(),
             " pre-tokenizers; Loom supports [Split, ByteLevel]");
  Field split{items[0], list.path + "[0]"}, bl{items[1], list.path + "[1]"};
  LOOM_CHECK(split.type(where) == "Split", where, ": '", split.path, "' is a ", split.type(where),
             ", expected Split");
  LOOM_CHECK(bl.type(where) == "ByteLevel", where, ": '", bl.path, "' is a ", bl.type(where),
             ", expected ByteLevel");
  LOOM_CHECK(!byte_level_use_regex(bl, where), where, ": '", bl.path,
             ".use_regex' true after a Split is not supported");
  Field pattern = split.at("pattern", where);
  LOOM_CHECK(pattern.has("Regex"), where, ": '", pattern.path,
             "' must be {\"Regex\": ...} (a String pattern is not supported)");
  const std::string re = pattern.at("Regex", where).str(where);
  const std::string behavior = split.has("behavior") ? split.at("behavior", where).str(where) : "";
  LOOM_CHECK(behavior == "Isolated", where, ": '", split.sub("behavior"), "' '", behavior,
             "' is not supported (Isolated)");
  LOOM_CHECK(!split.boolean("invert", false, where), where, ": '", split.sub("invert"),
             "' true is not supported");
  if (re == kGpt2Regex) return PreTokenizer::Gpt2;
  if (re == kCl100kRegex) return PreTokenizer::Cl100k;
  if (re == kQwen2Regex) return PreTokenizer::Qwen2;
  fail(where, ": '", pattern.path, ".Regex' ", Json(re).dump(),
       " is not one Loom implements (GPT-2's, Llama 3's = cl100k's, or Qwen2's)");
}

void check_model_options(const Field& m, const std::string& where) {
  const std::string type = m.type(where);
  LOOM_CHECK(type.empty() || type == "BPE", where, ": model type '", type,
             "' is not supported (Loom reads byte-level BPE)");
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
                 " is not supported (byte-level BPE has none)");
  LOOM_CHECK(!m.boolean("byte_fallback", false, where), where,
             ": 'model.byte_fallback' true (a SentencePiece-style vocabulary) is not supported");
}

struct Added {
  std::string content;
  int32_t id;
};

std::vector<Added> parse_added_tokens(const Field& root, const std::string& where) {
  std::vector<Added> out;
  if (!root.has("added_tokens")) return out;
  Field list = root.at("added_tokens", where);
  LOOM_CHECK(list.j.is_array(), where, ": 'added_tokens' must be an array");
  std::set<std::string> seen;
  for (size_t i = 0; i < list.j.size(); ++i) {
    Field t{list.j.as_array()[i], cat("added_tokens[", i, "]")};
    LOOM_CHECK(t.j.is_object(), where, ": '", t.path, "' must be an object");
    const std::string content = t.at("content", where).str(where);
    LOOM_CHECK(!content.empty(), where, ": '", t.sub("content"), "' is empty");
    int64_t id = 0;
    try {
      id = t.at("id", where).j.as_int(0, INT32_MAX - 1);
    } catch (const Error& e) {
      fail(where, ": '", t.sub("id"), "': ", e.what());
    }
    for (const char* k : {"lstrip", "rstrip", "single_word"})
      LOOM_CHECK(!t.boolean(k, false, where), where, ": '", t.sub(k), "' true (for '", content,
                 "') is not supported");
    t.boolean("special", false, where);  // checked for type; both kinds are cut out alike
    LOOM_CHECK(seen.insert(content).second, where, ": '", t.path, "' repeats the token '", content,
               "'");
    out.push_back({content, int32_t(id)});
  }
  return out;
}

std::string jsonl_quote(const std::string& s) {
  return Json(s).dump();
}

}  // namespace

BpeTokenizer hf_tokenizer_from_json(const Json& j, const std::string& where) {
  LOOM_CHECK(j.is_object(), where, ": expected a JSON object (a Hugging Face tokenizer.json)");
  Field root{j, ""};
  LOOM_CHECK(root.has("model"), where,
             ": missing field 'model' (not a Hugging Face tokenizer.json)");
  Field model = root.at("model", where);
  check_model_options(model, where);
  bool use_nfc = false;
  if (root.has("normalizer")) {
    const Field n = root.at("normalizer", where);
    use_nfc = n.type(where) == "NFC";
    LOOM_CHECK(use_nfc, where, ": normalizer ", n.j.dump(),
               " is not supported (none, or NFC as Qwen2's)");
    LOOM_CHECK(nfc_available(), where, ": normalizer NFC needs utf8proc, which this build did ",
               "not find (scripts/setup.sh installs libutf8proc-dev)");
  }
  if (root.has("truncation"))
    fail(where, ": 'truncation' is set; Loom encodes whole texts (write null)");
  if (root.has("decoder")) {
    const std::string d = root.at("decoder", where).type(where);
    LOOM_CHECK(d == "ByteLevel", where, ": decoder type '", d,
               "' is not supported (byte-level BPE decodes with ByteLevel)");
  }
  const PreTokenizer pre = parse_pre_tokenizer(
      {root.has("pre_tokenizer") ? j.at("pre_tokenizer") : Json(), "pre_tokenizer"}, where);
  const std::vector<Added> added = parse_added_tokens(root, where);
  std::map<std::string, int32_t> added_id;
  for (const Added& a : added) added_id[a.content] = a.id;

  // Vocabulary: byte-level strings -> ids. An added token may sit in it under its own text
  // (GPT-2's <|endoftext|>, or a token outside the alphabet): it becomes special, not ordinary.
  Field vocab = model.at("vocab", where);
  LOOM_CHECK(vocab.j.is_object(), where, ": 'model.vocab' must be an object of token -> id");
  size_t max_id = 0;
  for (const auto& [text, idj] : vocab.j.as_object()) {
    LOOM_CHECK(idj.type() == Json::Type::Int && idj.as_int() >= 0 && idj.as_int() < INT32_MAX,
               where, ": 'model.vocab' token ", jsonl_quote(text), " has no valid integer id");
    max_id = std::max(max_id, size_t(idj.as_int()));
  }
  for (const Added& a : added) max_id = std::max(max_id, size_t(a.id));
  check_id_bound(max_id, vocab.j.size() + added.size(), where);
  std::vector<std::string> tokens;
  std::string bytes;
  for (const auto& [text, idj] : vocab.j.as_object()) {
    const auto id = size_t(idj.as_int());
    auto a = added_id.find(text);
    const bool decoded = byte_level_decode(text, &bytes);
    if (a != added_id.end() || (decoded && added_id.count(bytes))) {
      const int32_t want = a != added_id.end() ? a->second : added_id.at(bytes);
      LOOM_CHECK(want == int32_t(id), where, ": added token ", jsonl_quote(text), " has id ", want,
                 " but 'model.vocab' gives it ", id);
      continue;  // a special token; its slot stays empty among the ordinary ones
    }
    LOOM_CHECK(decoded, where, ": 'model.vocab' token ", jsonl_quote(text),
               " is not in the byte-level alphabet");
    if (tokens.size() <= id) tokens.resize(id + 1);
    LOOM_CHECK(tokens[id].empty(), where, ": 'model.vocab' uses id ", id, " twice");
    tokens[id] = bytes;
  }
  SpecialTokens specials;
  for (const Added& a : added) {
    LOOM_CHECK(size_t(a.id) >= tokens.size() || tokens[size_t(a.id)].empty(), where,
               ": added token ", jsonl_quote(a.content), " has id ", a.id,
               ", which 'model.vocab' gives to ",
               jsonl_quote(byte_level_encode(tokens[size_t(a.id)])));
    specials.emplace_back(a.content, a.id);
  }

  // Merges: "a b" strings (the classic form) or ["a", "b"] pairs (tokenizers 0.20+).
  Field merges_f = model.at("merges", where);
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
    LOOM_CHECK(byte_level_decode(l, &a) && byte_level_decode(r, &b), where, ": 'model.merges[", k,
               "]' has a token outside the byte-level alphabet");
    // A merge that makes an added token never applies to text (added tokens are cut out
    // first); it is dropped, since that token is not an ordinary one here.
    if (special_bytes.count(a + b) || special_bytes.count(a) || special_bytes.count(b)) continue;
    merges.emplace_back(std::move(a), std::move(b));
  }
  const bool ignore_merges = model.boolean("ignore_merges", false, where);
  try {
    BpeTokenizer t = BpeTokenizer::from_merges(std::move(tokens), merges, pre, std::move(specials),
                                               ignore_merges);
    t.set_nfc(use_nfc);
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
  auto text_of = [&](int32_t id) { return id < 0 ? Json() : Json(tok.decode({&id, 1})); };
  c["bos_token"] = text_of(ids.bos);
  c["eos_token"] = text_of(ids.eos.empty() ? -1 : ids.eos.front());
  c["pad_token"] = text_of(tok.eot_id());
  if (!chat.empty()) c["chat_template"] = ChatTemplate::jinja(chat);
  c["clean_up_tokenization_spaces"] = false;
  c["model_max_length"] = model_max_length;
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  return c;
}

void save_hf_tokenizer(const BpeTokenizer& tok, const std::string& dir, const std::string& chat,
                       int64_t model_max_length) {
  const Json config = hf_tokenizer_config_json(tok, chat, model_max_length);  // checks `chat`
  make_dirs(dir);
  write_file_atomic((fs::path(dir) / "tokenizer.json").string(),
                    hf_tokenizer_json(tok).dump(2) + "\n");
  write_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), config.dump(2) + "\n");
}

}  // namespace loom::data
