// Structured outputs' grammar machinery: regexes against std::regex, UTF-8 ranges, the JSON
// Schema compiler against an independent validator over texts drawn at random from its
// automaton, refusals naming the keyword, and token masks against a brute-force walk of
// GPT-2's vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <string>

#include "core/error.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/utf8.h"
#include "data/bpe.h"
#include "infer/constrain/byte_dfa.h"
#include "infer/constrain/json_schema.h"
#include "infer/constrain/regex_parser.h"
#include "infer/constrain/token_constraint.h"
#include "infer/json_schema_check.h"

using namespace loom;
using namespace loom::infer::constrain;

namespace {

ByteDfa dfa_of(const std::string& regex) {
  return ByteDfa::build(parse_regex(regex).rx);
}

// Texts the automaton accepts, drawn byte by byte among the live transitions: a draw stops at
// an accepting state with probability 1/4; a third of the bytes go the shortest way to an
// accepting state, so that texts end.
struct RandomTexts {
  const ByteDfa& d;
  std::vector<int> dist;  // bytes to the nearest accepting state
  explicit RandomTexts(const ByteDfa& dfa) : d(dfa), dist(size_t(dfa.num_states()), 1 << 30) {
    for (bool changed = true; changed;) {
      changed = false;
      for (int s = 0; s < d.num_states(); ++s) {
        int best = d.accepting(s) ? 0 : 1 << 30;
        for (int b = 0; b < 256; ++b) {
          const int t = d.next(s, static_cast<unsigned char>(b));
          if (t != ByteDfa::kDead) best = std::min(best, dist[size_t(t)] + 1);
        }
        if (best < dist[size_t(s)]) dist[size_t(s)] = best, changed = true;
      }
    }
  }
  std::string draw(uint64_t seed) const {
    std::string s;
    int st = d.start();
    for (uint64_t k = 0;; ++k) {
      std::vector<int> next, closer;
      for (int b = 0; b < 256; ++b) {
        const int t = d.next(st, static_cast<unsigned char>(b));
        if (t == ByteDfa::kDead) continue;
        next.push_back(b);
        if (dist[size_t(t)] < dist[size_t(st)]) closer.push_back(b);
      }
      if (d.accepting(st) && (next.empty() || uniform_at(seed, 7, k) < 0.25)) return s;
      const std::vector<int>& from =
          !closer.empty() && uniform_at(seed, 9, k) < 0.33 ? closer : next;
      const int b = from[size_t(uniform_at(seed, 8, k) * double(from.size()))];
      s += static_cast<char>(b);
      st = d.next(st, static_cast<unsigned char>(b));
    }
  }
};

std::string refusal(const Json& schema) {
  try {
    json_schema_rx(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Constrain, RegexAgreesWithStdRegex) {
  const std::vector<std::string> patterns = {
      "abc",      "a|b|cd",          "(ab)*c",      "a+b?", "[a-c]{2,3}",
      "[^ab]c",   "\\d{3}-\\d{2}",   "(x|y){0,2}z", "a.c",  "(?:ab|a)(bc|c)",
      "[a\\-z]+", "\\w+@\\w+\\.com", "(a|b)*abb",   "x{3}", "(ab){1,}",
      "^ab$",     "[\\s]?q",         "a{0}b",       "[.]x"};
  const std::string alphabet = "abcxyzq0123-@. \n";
  for (const std::string& p : patterns) {
    const ByteDfa d = dfa_of(p);
    std::string core = p;
    const std::regex ref(core);
    for (uint64_t i = 0; i < 400; ++i) {
      std::string s;
      const int len = int(uniform_at(i, 1, 0) * 8);
      for (int k = 0; k < len; ++k)
        s += alphabet[size_t(uniform_at(i, 2, uint64_t(k)) * double(alphabet.size()))];
      EXPECT_EQ(d.matches(s), std::regex_match(s, ref)) << p << " on '" << s << "'";
    }
    const RandomTexts texts(d);
    for (uint64_t i = 0; i < 50; ++i) {  // std::regex reads bytes: ASCII draws only
      const std::string s = texts.draw(i);
      if (std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; })) {
        EXPECT_TRUE(std::regex_match(s, ref)) << p << " drew '" << s << "'";
      }
    }
  }
}

TEST(Constrain, RegexRefusesWhatAnAutomatonCannotHold) {
  for (const char* p : {"(a)\\1", "a(?=b)", "a(?!b)", "\\bword", "a++", "(ab", "ab)", "a{3,1}",
                        "[z-a]", "*a", "a^b"}) {
    try {
      parse_regex(p);
      ADD_FAILURE() << p << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("regex: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("at offset"), std::string::npos) << e.what();
    }
  }
}

TEST(Constrain, Utf8RangesMatchExactlyTheirCodePoints) {
  const CpRanges ranges = {
      {0x41, 0x5A}, {0xE9, 0x3A9}, {0x4E00, 0x4E10}, {0xD7F0, 0xE010}, {0x1F600, 0x1F64F}};
  const ByteDfa d = ByteDfa::build(rx_utf8(ranges));
  auto inside = [&](uint32_t cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;
    for (auto [lo, hi] : ranges)
      if (cp >= lo && cp <= hi) return true;
    return false;
  };
  for (uint32_t cp = 0; cp <= kMaxCodePoint; cp += (cp < 0x20000 ? 1 : 97)) {
    std::string s;
    utf8_append(s, cp);
    ASSERT_EQ(d.matches(s), inside(cp)) << std::hex << cp;
  }
  // Malformed sequences never match: an overlong 'A', a lone continuation byte, a truncation.
  EXPECT_FALSE(d.matches("\xC1\x81"));
  EXPECT_FALSE(d.matches("\x80"));
  EXPECT_FALSE(d.matches("\xE4\xB8"));
}

namespace {

const char* kBattery[] = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
        "age":{"type":"integer","minimum":0,"maximum":150},
        "tags":{"type":"array","items":{"type":"string","enum":["a","b\"q","c\\d"]},"maxItems":4},
        "address":{"type":"object","properties":{"city":{"type":"string","minLength":1,"maxLength":8},
                   "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city"],
                   "additionalProperties":false}},
        "required":["name","age"],"additionalProperties":false})",
    R"({"type":"array","items":{"type":"number"},"minItems":2,"maxItems":5})",
    R"({"anyOf":[{"type":"integer","exclusiveMinimum":-3,"exclusiveMaximum":1234},{"type":"null"},
                 {"type":"boolean"}]})",
    R"({"type":"object","properties":{"when":{"type":"string","format":"date-time"},
        "id":{"type":"string","format":"uuid"},"day":{"type":"string","format":"date"}},
        "required":["when","id","day"]})",
    R"({"$defs":{"point":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},
        "required":["x","y"]}},"type":"object","properties":{"a":{"$ref":"#/$defs/point"},
        "b":{"type":"array","items":{"$ref":"#/$defs/point"},"maxItems":3}},"required":["a"]})",
    R"({"type":"object","properties":{"k":{"const":{"x":[1,2]}},"s":{"type":["string","null"]},
        "free":{}},"required":["k","s","free"]})",
    R"({"type":"object","additionalProperties":{"type":"integer","minimum":10,"maximum":99}})",
    R"({"type":"string","pattern":"ab+c"})",
};

}  // namespace

TEST(Constrain, EveryTextOfASchemasAutomatonIsValidUnderIt) {
  for (const char* text : kBattery) {
    const Json schema = Json::parse(text);
    const ByteDfa d = ByteDfa::build(json_schema_rx(schema));
    const RandomTexts texts(d);
    for (uint64_t i = 0; i < 300; ++i) {
      const std::string s = texts.draw(i * 31 + 5);
      Json v;
      ASSERT_NO_THROW(v = Json::parse(s)) << text << "\ndrew: " << s;
      EXPECT_EQ(test::schema_violation(v, schema, schema), "") << text << "\ndrew: " << s;
    }
  }
}

TEST(Constrain, SchemasAcceptTheirValidDocumentsAndRejectInvalidOnes) {
  const Json person = Json::parse(kBattery[0]);
  const ByteDfa d = ByteDfa::build(json_schema_rx(person));
  EXPECT_TRUE(d.matches(R"({"age": 7, "name": "Ann"})"));
  EXPECT_TRUE(d.matches(R"({"address":{"city":"Oslo","zip":"01234"},"age":150,"name":"é\n\""})"));
  EXPECT_TRUE(d.matches(R"({"age":0,"name":"","tags":["b\"q","c\\d"]})"));
  EXPECT_FALSE(d.matches(R"({"age": 151, "name": "Ann"})"));        // above maximum
  EXPECT_FALSE(d.matches(R"({"age": -1, "name": "Ann"})"));         // below minimum
  EXPECT_FALSE(d.matches(R"({"name": "Ann"})"));                    // required age missing
  EXPECT_FALSE(d.matches(R"({"age": 1, "name": "Ann", "x": 1})"));  // not a listed property
  EXPECT_FALSE(d.matches(R"({"age": 1, "name": "a)"
                         "\n"
                         R"("})"));                                   // raw control character
  EXPECT_FALSE(d.matches(R"({"age":1,"name":"Ann","tags":["d"]})"));  // not in the enum
  EXPECT_FALSE(d.matches(R"({"address":{"zip":"01234"},"age":1,"name":"A"})"));  // city missing
  EXPECT_FALSE(d.matches(R"({"age":1,"name":"0123456789abc"})"));  // longer than maxLength

  const ByteDfa any = ByteDfa::build(json_object_rx());
  EXPECT_TRUE(any.matches(R"({"a": [1, {"b": null}], "c": "x"})"));
  EXPECT_TRUE(any.matches("{}"));
  EXPECT_FALSE(any.matches("[1]"));  // json_object: an object
  EXPECT_FALSE(any.matches(R"({"a": 01})"));
  EXPECT_FALSE(any.matches(R"({"a": 1,})"));
}

TEST(Constrain, UnsupportedKeywordsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems' at #/uniqueItems"},
      {R"({"type":"object","properties":{"a":{"type":"number","multipleOf":2}}})",
       "'multipleOf' at #/properties/a/multipleOf"},
      {R"({"oneOf":[{"type":"string"}]})", "'oneOf'"},
      {R"({"type":"string","format":"hostname"})", "format 'hostname'"},
      {R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},
          "$ref":"#/$defs/n"})",
       "recursive '$ref'"},
      {R"({"type":"string","pattern":"(a)\\1"})", "backreference"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "'b'"},
      {R"({"type":"widget"})", "unknown type 'widget'"},
      {R"({"type":"object","patternProperties":{"a":{}}})", "'patternProperties'"},
  };
  for (const auto& [schema, want] : cases) {
    const std::string got = refusal(Json::parse(schema));
    EXPECT_NE(got.find(want), std::string::npos) << schema << " -> " << got;
    EXPECT_EQ(got.rfind("json_schema: ", 0), 0u) << got;
  }
}

TEST(Constrain, TokenMasksAreExactlyTheTokensThatStayInTheLanguage) {
  const data::BpeTokenizer tok =
      data::load_gpt2_tokenizer(std::string(LOOM_DATA_FIXTURES) + "/tokenizers/gpt2");
  std::vector<std::string> bytes;
  for (int32_t i = 0; i < tok.vocab_size(); ++i)
    bytes.push_back(size_t(i) < tok.n_ordinary() ? tok.token_bytes(i) : std::string());
  auto vocab = std::make_shared<const TokenVocabulary>(bytes);
  const Json schema = Json::parse(kBattery[0]);
  TokenConstraint c(ByteDfa::build(json_schema_rx(schema)), vocab);
  // Along a valid document, each state's mask equals a brute-force walk of every token.
  const std::string doc = R"({"address": {"city": "Paris"}, "age": 42, "name": "Zoë"})";
  std::vector<int32_t> ids = tok.encode(doc);
  int st = c.start();
  for (size_t k = 0; k <= ids.size(); ++k) {
    const auto& bits = c.allowed(st);
    int n_allowed = 0;
    for (int32_t t = 0; t < vocab->size(); ++t) {
      const std::string& b = vocab->bytes(t);
      const bool want = !b.empty() && c.dfa().walk(st, b.data(), b.size()) != ByteDfa::kDead;
      const bool got = (bits[size_t(t) / 64] >> (t % 64)) & 1;
      ASSERT_EQ(got, want) << "token " << t << " at step " << k;
      n_allowed += got;
    }
    EXPECT_EQ(c.can_continue(st), n_allowed > 0);
    if (k == ids.size()) {
      EXPECT_TRUE(c.accepting(st));
      break;
    }
    EXPECT_FALSE(c.accepting(st));
    ASSERT_TRUE(c.allows(st, ids[k])) << k;
    st = c.advance(st, ids[k]);
  }
  EXPECT_EQ(c.advance(c.start(), tok.encode("[")[0]), ByteDfa::kDead);
  EXPECT_EQ(c.advance(c.start(), tok.eot_id()), ByteDfa::kDead);  // specials never
}
