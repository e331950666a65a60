#include "data/hf_components.h"

#include "core/error.h"
#include "data/normalize.h"

namespace loom::data {

HfField HfField::at(const char* k, const std::string& where) const {
  LOOM_CHECK(has(k), where, ": missing field '", sub(k), "'");
  return {j.at(k), sub(k)};
}

std::string HfField::str(const std::string& where) const {
  LOOM_CHECK(j.is_string(), where, ": '", path, "' must be a string");
  return j.as_string();
}

bool HfField::boolean(const char* k, bool dflt, const std::string& where) const {
  if (!has(k)) return dflt;
  LOOM_CHECK(j.at(k).type() == Json::Type::Bool, where, ": '", sub(k), "' must be true or false");
  return j.at(k).as_bool();
}

std::string HfField::type(const std::string& where) const {
  LOOM_CHECK(j.is_object(), where, ": '", path, "' must be an object");
  return has("type") ? at("type", where).str(where) : std::string();
}

HfField HfField::list(const char* k, const std::string& where) const {
  HfField l = at(k, where);
  LOOM_CHECK(l.j.is_array(), where, ": '", l.path, "' must be an array");
  return l;
}

namespace {

int64_t integer(const HfField& f, const char* k, int64_t dflt, const std::string& where) {
  if (!f.has(k)) return dflt;
  try {
    return f.j.at(k).as_int(0, 1 << 20);
  } catch (const Error& e) {
    fail(where, ": '", f.sub(k), "': ", e.what());
  }
}

// A {"String": s} or {"Regex": r} pattern as a regex; *is_string tells which.
std::string pattern_regex(const HfField& f, const std::string& where, bool* is_string) {
  HfField p = f.at("pattern", where);
  *is_string = p.has("String");
  if (*is_string) return hf_regex_quote(p.at("String", where).str(where));
  LOOM_CHECK(p.has("Regex"), where, ": '", p.path,
             "' must be {\"String\": ...} or {\"Regex\": ...}");
  return p.at("Regex", where).str(where);
}

void unsupported(const HfField& f, const std::string& type, const char* supported,
                 const std::string& where) {
  fail(where, ": '", f.sub("type"), "' ", Json(type).dump(), " is not supported (", supported, ")");
}

void parse_normalizer(const HfField& f, const std::string& where, HfComponents& c) {
  if (f.j.is_null()) return;
  const std::string type = f.type(where);
  HfNormalizer n;
  if (type == "Sequence") {
    HfField l = f.list("normalizers", where);
    for (size_t i = 0; i < l.j.size(); ++i) parse_normalizer(l.item(i), where, c);
    return;
  } else if (type == "Prepend") {
    n.text = f.at("prepend", where).str(where);
  } else if (type == "Replace") {
    n.kind = HfNormalizer::Kind::Replace;
    bool is_string = false;
    const std::string re = pattern_regex(f, where, &is_string);
    if (is_string)
      n.text = f.at("pattern", where).at("String", where).str(where);
    else
      n.regex = std::make_shared<HfRegex>(re, where + ": '" + f.sub("pattern") + ".Regex'");
    n.content = f.at("content", where).str(where);
  } else if (type == "Strip") {
    n.kind = HfNormalizer::Kind::Strip;
    n.left = f.boolean("strip_left", false, where);
    n.right = f.boolean("strip_right", false, where);
  } else if (type == "NFC" || type == "NFKC") {
    n.kind = type == "NFC" ? HfNormalizer::Kind::Nfc : HfNormalizer::Kind::Nfkc;
    LOOM_CHECK(nfc_available(), where, ": '", f.path, "' ", type, " needs utf8proc, which this ",
               "build did not find (scripts/setup.sh installs libutf8proc-dev)");
  } else if (type == "Precompiled") {
    // SentencePiece's compiled normalization rules (T5's, ALBERT's): an empty map is no step.
    const bool empty =
        !f.has("precompiled_charsmap") || (f.j.at("precompiled_charsmap").is_string() &&
                                           f.j.at("precompiled_charsmap").as_string().empty());
    LOOM_CHECK(empty, where, ": '", f.sub("precompiled_charsmap"),
               "' is not supported (SentencePiece's compiled normalization rules; load the "
               "model's tokenizer.model instead)");
    return;
  } else {
    unsupported(f, type, "Sequence, Prepend, Replace, Strip, NFC, NFKC, Precompiled (empty)",
                where);
  }
  c.normalizers.push_back(std::move(n));
}

HfPreTokenizer::Prepend prepend_scheme(const HfField& f, const std::string& where) {
  if (!f.has("prepend_scheme"))  // older files: add_prefix_space
    return f.boolean("add_prefix_space", true, where) ? HfPreTokenizer::Prepend::Always
                                                      : HfPreTokenizer::Prepend::Never;
  const std::string s = f.at("prepend_scheme", where).str(where);
  if (s == "always") return HfPreTokenizer::Prepend::Always;
  if (s == "first") return HfPreTokenizer::Prepend::First;
  LOOM_CHECK(s == "never", where, ": '", f.sub("prepend_scheme"), "' ", Json(s).dump(),
             " is not always, first or never");
  return HfPreTokenizer::Prepend::Never;
}

void parse_pre_tokenizer(const HfField& f, const std::string& where, HfComponents& c) {
  if (f.j.is_null()) return;
  const std::string type = f.type(where);
  HfPreTokenizer p;
  p.kind = HfPreTokenizer::Kind::Split;
  if (type == "Sequence") {
    HfField l = f.list("pretokenizers", where);
    for (size_t i = 0; i < l.j.size(); ++i) parse_pre_tokenizer(l.item(i), where, c);
    return;
  } else if (type == "Split") {
    HfSplitSpec spec;
    spec.regex = pattern_regex(f, where, &spec.is_string);
    spec.path = f.sub("pattern") + (spec.is_string ? ".String" : ".Regex");
    const std::string b = f.has("behavior") ? f.at("behavior", where).str(where) : "Isolated";
    using B = HfPreTokenizer::Behavior;
    if (b == "Isolated")
      p.behavior = B::Isolated;
    else if (b == "Removed")
      p.behavior = B::Removed;
    else if (b == "MergedWithPrevious")
      p.behavior = B::MergedWithPrevious;
    else if (b == "MergedWithNext")
      p.behavior = B::MergedWithNext;
    else
      fail(where, ": '", f.sub("behavior"), "' ", Json(b).dump(),
           " is not supported (Isolated, Removed, MergedWithPrevious, MergedWithNext)");
    LOOM_CHECK(!f.boolean("invert", false, where), where, ": '", f.sub("invert"),
               "' true is not supported");
    c.splits.push_back(std::move(spec));
  } else if (type == "Metaspace") {
    p.kind = HfPreTokenizer::Kind::Metaspace;
    p.replacement = f.has("replacement") ? f.at("replacement", where).str(where) : "\u2581";
    LOOM_CHECK(!p.replacement.empty(), where, ": '", f.sub("replacement"), "' is empty");
    p.prepend = prepend_scheme(f, where);
    p.split = f.boolean("split", true, where);
  } else if (type == "ByteLevel") {
    p.kind = HfPreTokenizer::Kind::ByteLevel;
    // Hugging Face's defaults: add_prefix_space and use_regex true when absent.
    LOOM_CHECK(!f.boolean("add_prefix_space", true, where), where, ": '", f.sub("add_prefix_space"),
               "' true is not supported (Loom encodes text as it is; GPT-2, Llama 3 and Qwen2 "
               "write false)");
    p.use_regex = f.boolean("use_regex", true, where);
  } else {
    unsupported(f, type, "Sequence, Split, Metaspace, ByteLevel", where);
  }
  c.pre_tokenizers.push_back(std::move(p));
}

void parse_decoder(const HfField& f, const std::string& where, HfComponents& c) {
  if (f.j.is_null()) return;
  const std::string type = f.type(where);
  HfDecoder d;
  d.kind = HfDecoder::Kind::Fuse;
  if (type == "Sequence") {
    HfField l = f.list("decoders", where);
    for (size_t i = 0; i < l.j.size(); ++i) parse_decoder(l.item(i), where, c);
    return;
  } else if (type == "ByteLevel") {
    c.byte_level_decoder = true;
    return;
  } else if (type == "Replace") {
    d.kind = HfDecoder::Kind::Replace;
    HfField p = f.at("pattern", where);
    LOOM_CHECK(p.has("String"), where, ": '", p.path,
               "' must be {\"String\": ...} (a Regex pattern is not supported in a decoder)");
    d.pattern = p.at("String", where).str(where);
    d.content = f.at("content", where).str(where);
  } else if (type == "ByteFallback") {
    d.kind = HfDecoder::Kind::ByteFallback;
  } else if (type == "Fuse") {
    d.kind = HfDecoder::Kind::Fuse;
  } else if (type == "Strip") {
    d.kind = HfDecoder::Kind::Strip;
    d.content = f.at("content", where).str(where);
    LOOM_CHECK(!d.content.empty(), where, ": '", f.sub("content"), "' is empty");
    d.start = size_t(integer(f, "start", 0, where));
    d.stop = size_t(integer(f, "stop", 0, where));
  } else if (type == "Metaspace") {
    d.kind = HfDecoder::Kind::Metaspace;
    d.pattern = f.has("replacement") ? f.at("replacement", where).str(where) : "\u2581";
    d.strip_first = prepend_scheme(f, where) != HfPreTokenizer::Prepend::Never;
  } else {
    unsupported(f, type, "Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace",
                where);
  }
  c.decoders.push_back(std::move(d));
}

void parse_post_processor(const HfField& f, const std::string& where, HfComponents& c) {
  if (f.j.is_null()) return;
  const std::string type = f.type(where);
  if (type == "ByteLevel") return;  // offsets only; the ids stay as they are
  if (type == "Sequence") {
    HfField l = f.list("processors", where);
    for (size_t i = 0; i < l.j.size(); ++i) parse_post_processor(l.item(i), where, c);
    return;
  }
  if (type != "TemplateProcessing")
    unsupported(f, type, "TemplateProcessing, ByteLevel, Sequence", where);
  LOOM_CHECK(c.prefix.empty() && c.suffix.empty(), where, ": '", f.path,
             "' is a second TemplateProcessing");
  HfField single = f.list("single", where);
  bool seen_text = false;
  for (size_t i = 0; i < single.j.size(); ++i) {
    HfField it = single.item(i);
    if (it.has("Sequence")) {
      const std::string id = it.at("Sequence", where).at("id", where).str(where);
      LOOM_CHECK(id == "A" && !seen_text, where, ": '", it.path,
                 "' must be the one Sequence \"A\" of a single text");
      seen_text = true;
      continue;
    }
    LOOM_CHECK(it.has("SpecialToken"), where, ": '", it.path,
               "' must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    const std::string name = it.at("SpecialToken", where).at("id", where).str(where);
    (seen_text ? c.suffix : c.prefix).push_back(name);
  }
  LOOM_CHECK(seen_text, where, ": '", single.path, "' has no Sequence \"A\"");
}

}  // namespace

HfComponents parse_hf_components(const Json& root, const std::string& where) {
  HfComponents c;
  HfField r{root, ""};
  static const Json none;
  auto field = [&](const char* k) { return HfField{r.has(k) ? root.at(k) : none, k}; };
  parse_normalizer(field("normalizer"), where, c);
  parse_pre_tokenizer(field("pre_tokenizer"), where, c);
  parse_decoder(field("decoder"), where, c);
  parse_post_processor(field("post_processor"), where, c);
  return c;
}

void compile_hf_splits(HfComponents& c, const std::string& where) {
  size_t k = 0;
  for (HfPreTokenizer& p : c.pre_tokenizers) {
    if (p.kind != HfPreTokenizer::Kind::Split) continue;
    p.regex = std::make_shared<HfRegex>(c.splits[k].regex, where + ": '" + c.splits[k].path + "' " +
                                                               Json(c.splits[k].regex).dump());
    ++k;
  }
}

}  // namespace loom::data
