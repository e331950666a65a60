// tokenizer.json steps around the BPE model (data/hf_pipeline.h) on small hand-made files: the
// SentencePiece-style vocabulary (byte fallback, Llama 2's normalizers and decoders), Metaspace
// with each prepend scheme, other normalizers, added tokens that strip white space, the
// post-processor's tokens, and Split regexes run with PCRE2.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/bpe.h"
#include "data/hf_pipeline.h"
#include "data/hf_regex.h"
#include "data/hf_tokenizer.h"
#include "data/normalize.h"
#include "data/unicode.h"
#include "hf_tokenizer_util.h"

using namespace loom;
using namespace loom::data;

namespace {

constexpr int32_t kByte0 = 3;  // <0x00> .. <0xFF> are ids 3 .. 258
enum : int32_t { kUnk = 0, kBos = 1, kEos = 2, kSp = 259, kA, kB, kSpA, kAB, kSpAB, kC };

Json obj(std::initializer_list<std::pair<const char*, Json>> kv) {
  Json o = Json::object();
  for (auto& [k, v] : kv) o[k] = v;
  return o;
}

Json added(int id, const std::string& content, bool lstrip = false, bool rstrip = false) {
  return obj({{"id", id},
              {"content", content},
              {"special", true},
              {"lstrip", lstrip},
              {"rstrip", rstrip},
              {"single_word", false},
              {"normalized", false}});
}

Json string_pattern(const std::string& s) {
  return obj({{"String", s}});
}

// A SentencePiece-style BPE: <unk> <s> </s>, the 256 byte tokens, then ▁ a b ▁a ab ▁ab c, with
// the merges ▁+a, a+b, ▁a+b in that order. Llama 2's normalizer, decoder and post-processor.
Json spm_json() {
  Json vocab = Json::object();
  vocab["<unk>"] = kUnk;
  vocab["<s>"] = kBos;
  vocab["</s>"] = kEos;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = kByte0 + b;
  }
  const char* words[] = {"\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "c"};
  for (int k = 0; k < 7; ++k) vocab[words[k]] = kSp + k;
  Json model = obj({{"type", "BPE"},
                    {"unk_token", "<unk>"},
                    {"byte_fallback", true},
                    {"fuse_unk", true},
                    {"vocab", vocab}});
  model["merges"] = Json(Json::Array{"\u2581 a", "a b", "\u2581a b"});
  Json j = obj({{"model", model}});
  j["added_tokens"] =
      Json(Json::Array{added(kUnk, "<unk>"), added(kBos, "<s>"), added(kEos, "</s>")});
  j["normalizer"] = obj({{"type", "Sequence"}});
  j["normalizer"]["normalizers"] = Json(Json::Array{
      obj({{"type", "Prepend"}, {"prepend", "\u2581"}}),
      obj({{"type", "Replace"}, {"pattern", string_pattern(" ")}, {"content", "\u2581"}})});
  j["decoder"] = obj({{"type", "Sequence"}});
  j["decoder"]["decoders"] = Json(Json::Array{
      obj({{"type", "Replace"}, {"pattern", string_pattern("\u2581")}, {"content", " "}}),
      obj({{"type", "ByteFallback"}}), obj({{"type", "Fuse"}}),
      obj({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}})});
  Json bos = obj({{"SpecialToken", obj({{"id", "<s>"}, {"type_id", 0}})}});
  Json text = obj({{"Sequence", obj({{"id", "A"}, {"type_id", 0}})}});
  j["post_processor"] = obj({{"type", "TemplateProcessing"}});
  j["post_processor"]["single"] = Json(Json::Array{bos, text});
  return j;
}

BpeTokenizer load(const Json& j) {
  return hf_tokenizer_from_json(Json::parse(j.dump()), "t.json");
}

std::vector<int32_t> bytes_of(std::string_view s) {
  std::vector<int32_t> v;
  for (char c : s) v.push_back(kByte0 + uint8_t(c));
  return v;
}

}  // namespace

TEST(HfPipeline, SentencePieceBpeMergesCharactersAndFallsBackToBytes) {
  const BpeTokenizer t = load(spm_json());
  EXPECT_FALSE(t.byte_level());
  EXPECT_EQ(t.encode("ab"), (std::vector<int32_t>{kSpAB}));
  // "▁ab▁é": é is not a token, so it is its two UTF-8 bytes' tokens.
  std::vector<int32_t> want = {kSpAB, kSp};
  for (int32_t id : bytes_of("\u00e9")) want.push_back(id);
  EXPECT_EQ(t.encode("ab \u00e9"), want);
  // A character whose bytes would merge with nothing still never merges with its neighbours.
  EXPECT_EQ(t.encode("a\u00e9b"), (std::vector<int32_t>{kSpA, kByte0 + 0xC3, kByte0 + 0xA9, kB}));
  // Added tokens are cut out first; each side is normalized on its own (both get the ▁).
  EXPECT_EQ(t.encode("a<s>b"), (std::vector<int32_t>{kSpA, kBos, kSp, kB}));
  EXPECT_EQ(t.encode("a<s>b", false).front(), kSpA);
  EXPECT_EQ(t.encode(""), std::vector<int32_t>{});
}

TEST(HfPipeline, LlamaDecoderChainStripsOneLeadingSpaceAndRepairsBytes) {
  const BpeTokenizer t = load(spm_json());
  for (const char* text : {"ab \u00e9", "  two leading", "caf\u00e9 \U0001F600"})
    EXPECT_EQ(t.decode(t.encode(text)), text) << text;
  // The text after an added token got its own ▁, which decodes as a space (as in Llama 2).
  EXPECT_EQ(t.decode(t.encode("a<s>b")), "a<s> b");
  // A byte run that is not UTF-8 decodes to U+FFFD per maximal subpart, as TextDecoder does.
  const std::vector<int32_t> cut = {kByte0 + 0xE2, kByte0 + 0x96, kA};
  EXPECT_EQ(t.decode(cut), "\uFFFDa");
  // Streaming appends each token's own text: the replacement as a space, a byte as itself.
  std::string s;
  for (int32_t id : t.encode("ab \u00e9")) t.decode_append(id, s);
  EXPECT_EQ(s, " ab \u00e9");
}

TEST(HfPipeline, PostProcessorAddsItsTokensOnlyWhenAsked) {
  const BpeTokenizer t = load(spm_json());
  std::vector<int32_t> ids = t.encode("ab");
  t.post_process(ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{kBos, kSpAB}));
  Json j = spm_json();
  Json eos = obj({{"SpecialToken", obj({{"id", "</s>"}, {"type_id", 0}})}});
  j["post_processor"]["single"].push_back(eos);
  Json seq = obj({{"type", "Sequence"}});
  seq["processors"] = Json(Json::Array{obj({{"type", "ByteLevel"}}), j["post_processor"]});
  j["post_processor"] = seq;
  ids = load(j).encode("ab");
  load(j).post_process(ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{kBos, kSpAB, kEos}));
}

TEST(HfPipeline, MetaspacePrependSchemes) {
  auto with_scheme = [](const char* scheme) {
    Json j = spm_json();
    j["normalizer"] = Json();
    j["pre_tokenizer"] = obj({{"type", "Metaspace"},
                              {"replacement", "\u2581"},
                              {"prepend_scheme", scheme},
                              {"split", true}});
    j["decoder"] = obj({{"type", "Metaspace"},
                        {"replacement", "\u2581"},
                        {"prepend_scheme", scheme},
                        {"split", true}});
    return load(j);
  };
  const BpeTokenizer always = with_scheme("always"), first = with_scheme("first"),
                     never = with_scheme("never");
  EXPECT_EQ(always.encode("a<s>a"), (std::vector<int32_t>{kSpA, kBos, kSpA}));
  EXPECT_EQ(first.encode("a<s>a"), (std::vector<int32_t>{kSpA, kBos, kA}));
  EXPECT_EQ(never.encode("a<s>a"), (std::vector<int32_t>{kA, kBos, kA}));
  // split: "▁a▁b" is the pieces "▁a" and "▁b" ("▁b" is not a token: ▁ then b).
  EXPECT_EQ(always.encode("a b"), (std::vector<int32_t>{kSpA, kSp, kB}));
  EXPECT_EQ(always.decode(always.encode("a b")), "a b");
  EXPECT_EQ(never.decode(never.encode("a b")), "a b");
  EXPECT_EQ(never.decode(std::vector<int32_t>{kSpA}), " a");
}

TEST(HfPipeline, StripReplaceAndCompatibilityNormalizers) {
  if (!nfc_available() || !hf_regex_available()) GTEST_SKIP() << "needs utf8proc and PCRE2";
  Json j = spm_json();
  Json seq = obj({{"type", "Sequence"}});
  seq["normalizers"] = Json(Json::Array{
      obj({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}),
      obj({{"type", "NFKC"}}),
      obj({{"type", "Replace"}, {"pattern", obj({{"Regex", "\\s+"}})}, {"content", " "}}),
      j["normalizer"]});
  j["normalizer"] = seq;
  const BpeTokenizer t = load(j);
  // NFKC makes the full-width ａ an a; white space runs (with U+3000) are one space.
  EXPECT_EQ(t.encode("\u3000 \uff41b \t\n a \u00a0"), (std::vector<int32_t>{kSpAB, kSpA}));
  // An empty Sequence (DeepSeek V3's) is no normalizer at all.
  Json empty = spm_json();
  empty["normalizer"]["normalizers"] = Json::array();
  EXPECT_EQ(load(empty).encode("ab"), (std::vector<int32_t>{kAB}));
}

TEST(HfPipeline, AddedTokensTakeTheWhiteSpaceTheyStrip) {
  Json j = spm_json();
  j["added_tokens"].push_back(added(300, "<m>", true, true));
  const BpeTokenizer t = load(j);
  EXPECT_EQ(t.encode("a \t<m>  b"), (std::vector<int32_t>{kSpA, 300, kSp, kB}));
  j["added_tokens"].as_array().back()["rstrip"] = false;
  EXPECT_EQ(load(j).encode("a \t<m> b"), (std::vector<int32_t>{kSpA, 300, kSp, kSp, kB}));
}

TEST(HfPipeline, InvalidUtf8IsReadAsTheReplacementCharacter) {
  EXPECT_EQ(utf8_replace_invalid("a\xE2\x96"), "a\uFFFD");
  EXPECT_EQ(utf8_replace_invalid("\xFF\xC3"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8_replace_invalid("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // a surrogate
  EXPECT_EQ(utf8_replace_invalid("\xF0\x9F\x98"), "\uFFFD");
  const BpeTokenizer t = load(spm_json());
  EXPECT_EQ(t.encode("a\xFF"), t.encode("a\uFFFD"));
}

TEST(HfPipeline, SplitRegexesRunWithJavaScriptMeanings) {
  if (!hf_regex_available()) GTEST_SKIP() << "built without PCRE2";
  auto matches = [](const std::string& re, const std::string& text) {
    std::vector<std::string> out;
    for (auto [b, e] : HfRegex(re, "test").find_all(text)) out.push_back(text.substr(b, e - b));
    return out;
  };
  EXPECT_EQ(matches("\\p{N}{1,3}", "12345 x 7"), (std::vector<std::string>{"123", "45", "7"}));
  // JavaScript's \s has U+FEFF and not U+0085; \d is ASCII.
  EXPECT_EQ(matches("\\s+", "a\uFEFFb\u0085c"), (std::vector<std::string>{"\uFEFF"}));
  EXPECT_EQ(matches("\\d+", "1\u0663"), (std::vector<std::string>{"1"}));
  EXPECT_EQ(matches("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "'S '\u017f"),
            (std::vector<std::string>{"'S"}));
  EXPECT_EQ(matches("x*", "ab"), (std::vector<std::string>{"", "", ""}));

  // A byte-level vocabulary behind a Split Loom's scanners do not know: pieces never cross
  // the regex's boundaries.
  Json j = loom::test::gpt2_tokenizer_json(false);
  Json split = obj({{"type", "Split"},
                    {"pattern", obj({{"Regex", "\\p{N}{1,3}"}})},
                    {"behavior", "Isolated"},
                    {"invert", false}});
  Json bl = Json::parse(j["pre_tokenizer"].dump());
  Json seq = obj({{"type", "Sequence"}});
  seq["pretokenizers"] = Json(Json::Array{split, bl});
  j["pre_tokenizer"] = seq;
  const BpeTokenizer t = load(j);
  EXPECT_TRUE(t.byte_level());
  std::vector<std::string> pieces;
  for (int32_t id : t.encode("1234567")) pieces.push_back(t.decode(std::vector<int32_t>{id}));
  std::string joined;
  size_t at = 0;
  for (const std::string& p : pieces) {
    EXPECT_LE(at / 3, (at + p.size() - 1) / 3) << p;
    EXPECT_EQ(at / 3, (at + p.size() - 1) / 3) << "piece '" << p << "' crosses a boundary";
    at += p.size();
    joined += p;
  }
  EXPECT_EQ(joined, "1234567");
}
