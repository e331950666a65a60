// `loom bench serve`'s load generation: seeded datasets and Poisson arrivals, the vllm-style
// summary of request records, and the in-process driver against a real (tiny) engine.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "infer/decode_bench.h"
#include "infer/engine.h"
#include "infer/load_gen.h"
#include "infer/model_runner.h"
#include "model/decoder.h"

using namespace loom;
using namespace loom::infer;

TEST(LoadGen, PromptsAreSeededAndInTheVocabulary) {
  LoadSpec s;
  s.input_len = 50, s.vocab = 7, s.seed = 3;
  const std::vector<int32_t> a = random_prompt(s, 0), b = random_prompt(s, 1);
  EXPECT_EQ(a, random_prompt(s, 0));
  EXPECT_NE(a, b);
  EXPECT_EQ(a.size(), 50u);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 7) << t;
  s.seed = 4;
  EXPECT_NE(a, random_prompt(s, 0));
}

TEST(LoadGen, PoissonArrivalsHaveTheRequestedRate) {
  LoadSpec s;
  s.num_prompts = 4000, s.rate = 8, s.seed = 1;
  const std::vector<double> t = poisson_arrivals(s);
  ASSERT_EQ(t.size(), 4000u);
  for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  // Mean gap 1/rate; the coefficient of variation of exponential gaps is 1 (Poisson, not a
  // fixed period): both within a few standard errors for 4000 draws.
  double sum = 0, sq = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const double g = t[i] - (i ? t[i - 1] : 0);
    sum += g, sq += g * g;
  }
  const double mean = sum / 4000, var = sq / 4000 - mean * mean;
  EXPECT_NEAR(mean, 1.0 / 8, 0.125 * 0.06);
  EXPECT_NEAR(std::sqrt(var) / mean, 1.0, 0.08);
  s.rate = std::numeric_limits<double>::infinity();
  for (double x : poisson_arrivals(s)) ASSERT_EQ(x, 0);
  s.rate = 0;
  EXPECT_THROW(poisson_arrivals(s), Error);
}

TEST(LoadGen, PercentilesInterpolateAsNumpy) {
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 99), 4.96);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

TEST(LoadGen, SummaryComputesVllmsFigures) {
  std::vector<RequestRecord> r(3);
  r[0] = {0.0, 0.5, 1.5, {0.5, 1.0, 1.5}, 10, 3, true, ""};    // TPOT 0.5, ITLs 0.5 0.5
  r[1] = {1.0, 1.2, 1.2, {1.2}, 20, 1, true, ""};              // one token: no TPOT
  r[2] = {2.0, 0.0, 2.5, {}, 30, 0, false, "HTTP 503: full"};  // failed
  const LoadSummary s = summarize(r, 4.0);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.first_error, "HTTP 503: full");
  EXPECT_EQ(s.input_tokens, 30);
  EXPECT_EQ(s.output_tokens, 4);
  EXPECT_DOUBLE_EQ(s.request_throughput, 0.5);
  EXPECT_DOUBLE_EQ(s.output_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 34.0 / 4);
  EXPECT_NEAR(s.ttft.mean, (500 + 200) / 2.0, 1e-9);
  EXPECT_NEAR(s.tpot.mean, 500, 1e-9);
  EXPECT_NEAR(s.itl.median, 500, 1e-9);
  EXPECT_NEAR(s.e2e.p99, 1500 - 0.01 * 1300, 1e-9);  // between 200 ms and 1500 ms
  const Json j = s.to_json();
  EXPECT_EQ(j.at("failed").as_int(), 1);
  EXPECT_NE(s.table("t").find("P99 TPOT (ms):"), std::string::npos);
}

namespace {

ModelConfig tiny() {
  ModelConfig c = model_preset("tiny");
  c.n_layer = 2, c.d_model = 32, c.n_head = 4, c.n_kv_head = 4, c.head_dim = 8, c.d_ff = 64;
  c.vocab = 64, c.max_seq = 96;
  return c;
}

}  // namespace

TEST(LoadGen, InProcessDriverAnswersEveryRequestAndTimesEachToken) {
  Decoder m(tiny(), cpu_backend());
  m.params().init(1);
  DecoderRunner runner(m);
  EngineConfig ec;
  ec.num_blocks = 64;
  LoomEngine e(runner, ec);
  e.start();
  LoadSpec s;
  s.num_prompts = 12, s.input_len = 20, s.output_len = 9, s.vocab = 64, s.rate = 400;
  double duration = 0;
  const std::vector<RequestRecord> rec = run_load_in_process(e, s, &duration);
  e.stop(0);
  ASSERT_EQ(rec.size(), 12u);
  for (const RequestRecord& r : rec) {
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.output_tokens, 9);
    EXPECT_EQ(r.chunk_times.size(), 9u);  // one engine step per token
    EXPECT_LE(r.sent, r.first);
    EXPECT_LE(r.first, r.done);
  }
  const LoadSummary sum = summarize(rec, duration);
  EXPECT_EQ(sum.completed, 12);
  EXPECT_EQ(sum.output_tokens, 12 * 9);
  EXPECT_EQ(e.cache().num_used(), 0);
  // A prompt longer than the context is rejected, and counted as a failure, not a hang.
  LoomEngine e2(runner, ec);
  e2.start();
  s.num_prompts = 2, s.input_len = 200;
  const std::vector<RequestRecord> bad = run_load_in_process(e2, s, &duration);
  e2.stop(0);
  EXPECT_EQ(summarize(bad, duration).failed, 2);
  EXPECT_NE(bad[0].error.find("rejected (400)"), std::string::npos) << bad[0].error;
}

TEST(LoadGen, DecodeWeightBytesCountEveryLinearOnce) {
  Decoder m(tiny(), cpu_backend());
  // gpt2 tiny: per layer qkv 32x96, proj 32x32, fc 32x64, proj 64x32; tied head 64x32.
  const double linear = 2 * (32 * 96 + 32 * 32 + 32 * 64 + 64 * 32) + 64 * 32;
  const double all = double(m.config().num_params()), wpe = 96 * 32, wte = 64 * 32;
  const double other = all - wpe - wte - (linear - wte);  // norms and biases
  EXPECT_DOUBLE_EQ(decode_weight_bytes(m, 4), linear * 4 + other * 4);
  EXPECT_DOUBLE_EQ(decode_weight_bytes(m, 2), linear * 2 + other * 4);
  EXPECT_GT(measure_read_bandwidth_gbs(1), 0.1);
}
