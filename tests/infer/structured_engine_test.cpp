// Structured outputs through the serving engine: a tiny random model over GPT-2's vocabulary,
// sampled at temperature >= 1 under 4 seeds x 4 completions, writes texts that an independent JSON Schema
// check (json_schema_check.h) finds valid every time, for a battery of schemas (nested objects,
// arrays, enums, numbers, strings with escapes); regex and choice constraints likewise; greedy
// decoding too; a completion cut by max_tokens ends with finish_reason "length".
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <set>

#include "core/json.h"
#include "data/bpe.h"
#include "infer/constrain/json_schema.h"
#include "infer/constrain/regex_parser.h"
#include "infer/constrain/token_constraint.h"
#include "infer/engine.h"
#include "infer/json_schema_check.h"
#include "infer/model_runner.h"
#include "model/decoder.h"

#include "infer_test_util.h"

using namespace loom;
using namespace loom::infer;
namespace cs = loom::infer::constrain;

namespace {

const data::BpeTokenizer& gpt2() {
  static const data::BpeTokenizer t =
      data::load_gpt2_tokenizer(std::string(LOOM_DATA_FIXTURES) + "/tokenizers/gpt2");
  return t;
}

std::shared_ptr<const cs::TokenVocabulary> vocab() {
  static const auto v = [] {
    std::vector<std::string> bytes;
    for (int32_t i = 0; i < gpt2().vocab_size(); ++i)
      bytes.push_back(size_t(i) < gpt2().n_ordinary() ? gpt2().token_bytes(i) : std::string());
    return std::make_shared<const cs::TokenVocabulary>(bytes);
  }();
  return v;
}

struct Model {
  Model(Family f, uint64_t seed) : m(config(f), cpu_backend()), runner(initialised(m, seed)) {}
  static Decoder& initialised(Decoder& d, uint64_t seed) {
    d.params().init(seed);
    return d;
  }
  static ModelConfig config(Family f) {
    ModelConfig c = infer::test::tiny(f);
    c.vocab = gpt2().vocab_size();
    c.max_seq = 512;
    return c;
  }
  Decoder m;
  DecoderRunner runner;
};

struct Output {
  std::string text, reason;
};

// Every completion of `seeds` requests (n each) under `c`.
std::vector<Output> run(ModelRunner& runner, std::shared_ptr<const cs::TokenConstraint> c,
                        float temperature, int seeds, int n, int max_tokens) {
  EngineConfig cfg;
  cfg.eos_ids = {gpt2().eot_id()};
  cfg.detokenize = [](const std::vector<int32_t>& ids) { return gpt2().decode(ids); };
  cfg.num_blocks = 4096;
  LoomEngine e(runner, cfg);
  std::vector<Output> out(size_t(seeds * n));
  for (int s = 0; s < seeds; ++s) {
    SamplingParams p;
    p.temperature = temperature;
    p.max_tokens = max_tokens;
    p.seed = uint64_t(1000 + s);
    p.n = n;
    p.constraint = c;
    e.submit(gpt2().encode("Answer in JSON:"), p, [&out, s, n](const TokenEvent& ev) {
      Output& o = out[size_t(s * n + ev.index)];
      o.text += ev.text;
      if (ev.finished) o.reason = ev.finish_reason;
    });
  }
  e.run_until_idle();
  return out;
}

std::shared_ptr<const cs::TokenConstraint> compile(const cs::Rx& rx) {
  return std::make_shared<const cs::TokenConstraint>(cs::ByteDfa::build(rx), vocab());
}

// Schemas whose texts are bounded in length, so that every completion can end within
// max_tokens (a token has at least one byte).
const char* kSchemas[] = {
    // nested objects, optional members, strings with escapes
    R"({"type":"object","properties":{
         "user":{"type":"object","properties":{
            "name":{"type":"string","maxLength":6},
            "quote":{"type":"string","enum":["say \"hi\"","back\\slash","tab\tnew\nline"]}},
           "required":["name"],"additionalProperties":false},
         "ok":{"type":"boolean"}},
       "required":["user","ok"],"additionalProperties":false})",
    // arrays with bounds, numbers
    R"({"type":"object","properties":{
         "xs":{"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3},
         "n":{"type":"integer","minimum":-50,"maximum":2000}},
       "required":["xs","n"]})",
    // enums, anyOf, null, nested arrays of objects
    R"({"type":"array","maxItems":3,"items":{"type":"object","properties":{
         "kind":{"enum":["cat","dog",7,null]},
         "tag":{"anyOf":[{"type":"string","maxLength":4},{"type":"null"}]}},
       "required":["kind","tag"]}})",
    // formats and patterns
    R"({"type":"object","properties":{
         "day":{"type":"string","format":"date"},
         "code":{"type":"string","pattern":"^[A-Z]{2}-[0-9]{3}$"},
         "id":{"type":"string","format":"uuid"}},
       "required":["day","code","id"]})",
};

}  // namespace

TEST(StructuredEngine, SampledOutputsAreValidUnderEverySchema) {
  Model model(Family::Llama, 11);
  int checked = 0;
  for (const char* text : kSchemas) {
    const Json schema = Json::parse(text);
    const auto c = compile(cs::json_schema_rx(schema));
    for (float temperature : {1.0f, 1.5f}) {
      for (const Output& o : run(model.runner, c, temperature, 4, 4, 400)) {
        ASSERT_EQ(o.reason, "stop") << text << "\n" << o.text;
        Json v;
        ASSERT_NO_THROW(v = Json::parse(o.text)) << o.text;
        EXPECT_EQ(loom::test::schema_violation(v, schema, schema), "") << text << "\n" << o.text;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * 2 * 4 * 4);
}

TEST(StructuredEngine, GreedyOutputsAreValidOnBothFamilies) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Model model(f, 5);
    for (const char* text : kSchemas) {
      const Json schema = Json::parse(text);
      for (const Output& o : run(model.runner, compile(cs::json_schema_rx(schema)), 0, 1, 1, 400)) {
        ASSERT_EQ(o.reason, "stop") << o.text;
        EXPECT_EQ(loom::test::schema_violation(Json::parse(o.text), schema, schema), "") << o.text;
      }
    }
  }
}

TEST(StructuredEngine, JsonObjectRegexAndChoice) {
  Model model(Family::GPT2, 3);
  // Any JSON object: bounded by max_tokens, so only complete ones are checked; they parse.
  int complete = 0;
  for (const Output& o : run(model.runner, compile(cs::json_object_rx()), 1.0f, 4, 2, 100)) {
    if (o.reason != "stop") continue;
    ++complete;
    Json v;
    ASSERT_NO_THROW(v = Json::parse(o.text)) << o.text;
    EXPECT_TRUE(v.is_object()) << o.text;
  }
  EXPECT_GT(complete, 0);
  const std::string pattern = "[a-z]{2,5}-(0|[1-9][0-9]{0,3})(\\.[A-F]{1,6})?";
  const std::regex ref(pattern);
  for (const Output& o : run(model.runner, compile(cs::parse_regex(pattern).rx), 1.5f, 8, 4, 64)) {
    ASSERT_EQ(o.reason, "stop") << o.text;
    EXPECT_TRUE(std::regex_match(o.text, ref)) << o.text;
  }
  const std::vector<std::string> choices = {"yes", "no", "maybe so", "{\"x\": 1}"};
  std::vector<cs::Rx> alts;
  for (const auto& ch : choices) alts.push_back(cs::rx_literal(ch));
  std::set<std::string> seen;
  for (const Output& o : run(model.runner, compile(cs::rx_alt(std::move(alts))), 2.0f, 10, 4, 16)) {
    ASSERT_EQ(o.reason, "stop") << o.text;
    EXPECT_NE(std::find(choices.begin(), choices.end(), o.text), choices.end()) << o.text;
    seen.insert(o.text);
  }
  EXPECT_GE(seen.size(), 2u);  // sampled, not one fixed answer
}

TEST(StructuredEngine, CutByMaxTokensEndsWithLengthAndAValidPrefix) {
  Model model(Family::Llama, 2);
  const Json schema = Json::parse(kSchemas[0]);
  const auto c = compile(cs::json_schema_rx(schema));
  for (const Output& o : run(model.runner, c, 1.0f, 4, 2, 3)) {
    EXPECT_EQ(o.reason, "length") << o.text;
    const int st = c->dfa().walk(c->start(), o.text.data(), o.text.size());
    EXPECT_NE(st, cs::ByteDfa::kDead) << o.text;  // a prefix of a valid text
    EXPECT_FALSE(c->accepting(st)) << o.text;
  }
}
