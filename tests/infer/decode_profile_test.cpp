// The decode profile (`loom bench serve --decode`'s breakdown of a token's time): installed after
// a sequence's first token, it counts exactly the decode steps that follow, each linear layer and
// each layer's attention once per step, with the bytes those read (weights and scales; every
// cached position's keys and values); nested parts take no more time than the part holding them;
// uninstalled, nothing is recorded.
#include <gtest/gtest.h>

#include "infer/decode_profile.h"
#include "infer/engine.h"
#include "infer/model_runner.h"
#include "infer/weight_quant.h"
#include "model/decoder.h"

#include "infer_test_util.h"

using namespace loom;
using namespace loom::infer;
using loom::infer::test::prompt;
using loom::infer::test::tiny;

namespace {

// One greedy request of `prompt_len` tokens for `tokens` tokens; `on_first` runs in the event
// that carries the first token.
void run_one(ModelRunner& r, int prompt_len, int tokens, const std::function<void()>& on_first) {
  EngineConfig ec;
  ec.num_blocks = 32;
  LoomEngine e(r, ec);
  SamplingParams g;
  g.temperature = 0;
  g.max_tokens = tokens;
  g.ignore_eos = true;
  int seen = 0;
  e.submit(prompt(prompt_len, 3), g, [&](const TokenEvent& ev) {
    if (seen == 0 && !ev.tokens.empty()) on_first();
    seen += int(ev.tokens.size());
  });
  e.run_until_idle();
  ASSERT_EQ(seen, tokens);
}

}  // namespace

TEST(DecodeProfile, CountsEachDecodeStepsLayersAndBytes) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    const ModelConfig c = tiny(f);
    Decoder model(c, cpu_backend());
    model.params().init(1);
    QuantizedWeights q(model, WeightType::INT8);
    DecoderRunner runner(model);
    const int prompt_len = 10, tokens = 6, steps = tokens - 1;
    DecodeProfile p;
    run_one(runner, prompt_len, tokens, [&] { set_decode_profile(&p); });
    set_decode_profile(nullptr);
    using P = DecodeProfile;
    EXPECT_EQ(p.calls[P::kStep], steps);
    EXPECT_EQ(p.calls[P::kForward], steps);
    EXPECT_EQ(p.calls[P::kSample], steps);
    const std::vector<Decoder::LinearInfo> linears = model.linears();
    EXPECT_EQ(p.calls[P::kGemv], steps * int64_t(linears.size()));
    double weight_bytes = 0;  // int8: one byte a weight, a 4-byte scale per output channel
    for (const Decoder::LinearInfo& l : linears) weight_bytes += double(l.in) * l.out + 4.0 * l.out;
    EXPECT_DOUBLE_EQ(p.bytes[P::kGemv], steps * weight_bytes);
    EXPECT_EQ(p.calls[P::kAttention], steps * int64_t(c.n_layer));
    // Step s (0-based) attends over prompt_len + 1 + s positions (fp32 keys and values).
    double positions = 0;
    for (int s = 0; s < steps; ++s) positions += prompt_len + 1 + s;
    EXPECT_DOUBLE_EQ(p.bytes[P::kAttention],
                     positions * 2 * c.n_kv_head * c.head_dim * 4 * c.n_layer);
    EXPECT_GT(p.seconds[P::kGemv], 0);
    EXPECT_GT(p.seconds[P::kAttention], 0);
    EXPECT_LE(p.seconds[P::kGemv] + p.seconds[P::kAttention], p.seconds[P::kForward]);
    EXPECT_LE(p.seconds[P::kForward] + p.seconds[P::kSample], p.seconds[P::kStep]);

    // Not installed: another request records nothing.
    const DecodeProfile before = p;
    run_one(runner, prompt_len, tokens, [] {});
    for (int i = 0; i < P::kParts; ++i) EXPECT_EQ(p.calls[i], before.calls[i]) << i;
  }
}
