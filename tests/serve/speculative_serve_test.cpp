// `loom serve` with n-gram speculative decoding: greedy completions equal the no-cache greedy
// text, usage reports the guesses kept and replaced (completion_tokens_details), and /metrics
// counts them under vLLM's spec_decode names.
#include "core/utf8.h"
#include "serve/server_fixture.h"

using namespace loom;
using namespace loom::serve_test;

namespace {

// The value of the metric line `name` in a /metrics text (-1 when absent).
double metric(const std::string& text, const std::string& name) {
  const std::string key = "\nloom:" + name + " ";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + key.size()));
}

}  // namespace

TEST_F(Fixture, SpeculativeGreedyCompletionsReportTheirGuesses) {
  speculative.method = infer::SpeculativeMethod::Ngram;
  speculative.num_speculative_tokens = 4;
  start();
  const std::string prompt = "abcabcabcabcabcabc";
  auto [st, c] = post("/v1/completions",
                      R"({"prompt": ")" + prompt + R"(", "max_tokens": 40, "temperature": 0})");
  ASSERT_EQ(st, 200) << c.dump();
  EXPECT_EQ(c.at("choices").as_array()[0].at("text").as_string(),
            utf8_lossy(greedy_text(bytes(prompt), 40)));
  const infer::EngineStats s = engine->stats();
  ASSERT_GT(s.spec_draft_tokens_total, 0);
  const Json& d = c.at("usage").at("completion_tokens_details");
  EXPECT_EQ(d.at("accepted_prediction_tokens").as_int(), s.spec_accepted_tokens_total);
  EXPECT_EQ(
      d.at("accepted_prediction_tokens").as_int() + d.at("rejected_prediction_tokens").as_int(),
      s.spec_draft_tokens_total);
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(metric(m->body, "spec_decode_num_draft_tokens_total"),
            double(s.spec_draft_tokens_total));
  EXPECT_EQ(metric(m->body, "spec_decode_num_accepted_tokens_total"),
            double(s.spec_accepted_tokens_total));
  EXPECT_GT(metric(m->body, "spec_decode_num_drafts_total"), 0);
  EXPECT_NEAR(metric(m->body, "spec_decode_draft_acceptance_rate"),
              double(s.spec_accepted_tokens_total) / double(s.spec_draft_tokens_total), 1e-6);
}
