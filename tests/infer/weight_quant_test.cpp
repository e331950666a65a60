// Weight-only bf16, int8 and fp8 serving: the engine's greedy output with bf16 weights equals a
// reference run of the fp32 model whose weights were rounded to bf16 (both families), and int8
// and fp8 logits stay within a stated tolerance of the fp32 ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "infer/weight_quant.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm_lowp.h"
#include "model/decoder.h"

#include "infer_test_util.h"

using namespace loom;
using namespace loom::infer;
using loom::infer::test::prompt;
using loom::infer::test::seeded_completions;
using loom::infer::test::tiny;

namespace {

// Greedy continuations of several prompts at once through the engine.
std::vector<std::vector<int32_t>> engine_greedy(ModelRunner& r, int n_prompts, int tokens) {
  EngineConfig ec;
  ec.num_blocks = 64;
  LoomEngine e(r, ec);
  SamplingParams g;
  g.temperature = 0;
  g.max_tokens = tokens;
  g.ignore_eos = true;
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n_prompts));
  for (int i = 0; i < n_prompts; ++i)
    e.submit(prompt(5 + 7 * i, 10 + i), g, [&out, i](const TokenEvent& ev) {
      out[size_t(i)].insert(out[size_t(i)].end(), ev.tokens.begin(), ev.tokens.end());
    });
  e.run_until_idle();
  return out;
}

// Logits of every position of one sequence (the no-cache forward).
std::vector<float> all_logits(Decoder& m, const std::vector<int32_t>& toks) {
  const int N = int(toks.size()), V = m.config().vocab;
  std::vector<int32_t> pos(static_cast<size_t>(N)), cu = {0, N};
  std::vector<int> rows(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) pos[size_t(i)] = i, rows[size_t(i)] = i;
  ModelInput in;
  in.tokens = toks.data();
  in.positions = pos.data();
  in.cu_seqlens = cu.data();
  in.N = N;
  in.nseq = 1;
  std::vector<float> lg(size_t(N) * V);
  m.forward_logits(in, rows, lg.data());
  return lg;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

double rms(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * double(a[i] - b[i]);
  return std::sqrt(s / double(a.size()));
}

double max_abs(const std::vector<float>& a) {
  double d = 0;
  for (float x : a) d = std::max(d, double(std::fabs(x)));
  return d;
}

}  // namespace

class WeightQuant : public testing::TestWithParam<Family> {};

std::string weight_of(const Decoder& m, const std::string& linear) {
  if (linear != "head") return linear + ".weight";
  return m.params().has("head.weight") ? "head.weight" : "embed.wte";
}

TEST_P(WeightQuant, Bf16GreedyEqualsTheFp32ModelWithBf16RoundedWeights) {
  ModelConfig c = tiny(GetParam());
  // Untied, so that rounding the head's weight for the reference leaves the embedding table
  // (read in fp32 by both) alone; the tied case is covered by the int8 test's tolerance.
  c.tied = false;
  Decoder model(c, cpu_backend()), rounded(c, cpu_backend()), fp32(c, cpu_backend());
  for (Decoder* m : {&model, &rounded, &fp32}) m->params().init(1);
  // The reference: every linear weight rounded to bf16, computed by the ordinary fp32 path.
  int64_t linear_elems = 0;
  for (const Decoder::LinearInfo& l : rounded.linears()) {
    float* p = rounded.params().ptr(weight_of(rounded, l.name));
    for (int64_t i = 0; i < int64_t(l.in) * l.out; ++i) p[i] = round_bf16(p[i]);
    linear_elems += int64_t(l.in) * l.out;
  }
  QuantizedWeights q(model, WeightType::BF16);
  EXPECT_EQ(q.stored_bytes(), 2 * linear_elems);
  DecoderRunner rq(model), rr(rounded);
  const auto got = engine_greedy(rq, 3, 24), want = engine_greedy(rr, 3, 24);
  EXPECT_EQ(got, want);
  // The logits agree up to summation order, and are nearer the rounded model's than the
  // unrounded one's (the bf16 copy is what is read).
  std::vector<int32_t> seq = prompt(9, 3);
  seq.insert(seq.end(), got[0].begin(), got[0].end());
  const std::vector<float> lq = all_logits(model, seq), lr = all_logits(rounded, seq),
                           lf = all_logits(fp32, seq);
  EXPECT_LE(max_abs_diff(lq, lr), 1e-5 * max_abs(lr));
  EXPECT_GT(max_abs_diff(lq, lf), 10 * max_abs_diff(lq, lr));
}

// fp32 weights through the decode GEMV (no copy): the same greedy output as the model's own
// BLAS path, logits equal up to summation order.
TEST_P(WeightQuant, Fp32GemvDecodeEqualsTheBlasPath) {
  const ModelConfig c = tiny(GetParam());
  Decoder model(c, cpu_backend()), plain(c, cpu_backend());
  model.params().init(1);
  plain.params().init(1);
  QuantizedWeights q(model, WeightType::F32);
  EXPECT_EQ(q.stored_bytes(), 0);
  DecoderRunner rq(model), rp(plain);
  EXPECT_EQ(engine_greedy(rq, 3, 20), engine_greedy(rp, 3, 20));
  const std::vector<int32_t> seq = prompt(12, 5);  // 12 rows: the GEMV path (<= 16)
  const std::vector<float> a = all_logits(model, seq), b = all_logits(plain, seq);
  EXPECT_LE(max_abs_diff(a, b), 1e-5 * max_abs(b));
}

// int8 with a per-output-channel scale: the logits' RMS difference from the fp32 model's within
// 5% of their RMS, and every logit within 10% of the largest logit magnitude (measured here:
// 2-3% and 2-7%; this tiny model's weights have std 0.3 over rows of 32 to 64, so one step of
// 1/127 of a row's largest weight is coarse); and not equal to the fp32 logits (the int8 copy is
// what is read).
TEST_P(WeightQuant, Int8LogitsStayWithinTolerance) {
  const ModelConfig c = tiny(GetParam());
  Decoder model(c, cpu_backend()), fp32(c, cpu_backend());
  model.params().init(1);
  fp32.params().init(1);
  std::vector<int32_t> seq = prompt(40, 4);
  const std::vector<float> lf = all_logits(fp32, seq);
  {
    QuantizedWeights q(model, WeightType::INT8);
    const std::vector<float> l8 = all_logits(model, seq);
    const double d = max_abs_diff(l8, lf);
    EXPECT_LE(rms(l8, lf), 0.05 * rms(lf, std::vector<float>(lf.size(), 0.f)));
    EXPECT_LE(d, 0.1 * max_abs(lf));
    EXPECT_GT(d, 0);
    // Decode through the engine (the GEMV kernel) gives the same tokens as prefill's logits say.
    DecoderRunner r(model);
    const auto out = engine_greedy(r, 2, 8);
    EXPECT_EQ(out[0].size(), 8u);
  }
  // Detached: the model is back on its fp32 weights.
  EXPECT_EQ(all_logits(model, seq), lf);
}

// fp8 E4M3 with a per-output-channel scale (448 / the row's largest magnitude): one byte per
// weight plus 4 per channel. The logits equal, up to summation order, those of the fp32 model
// whose linear weights were replaced by their dequantised values (what is read is the fp8 copy),
// and stay within a stated tolerance of the fp32 model's: RMS difference within 20% of the
// logits' RMS and every logit within 35% of the largest magnitude (measured: 10.6% / 14.7% for
// gpt2, 12.6% / 23.3% for llama, against int8's 2-3% / 2-7%: E4M3 keeps 3 mantissa bits, a
// relative error up to 1/16 on every weight, where int8's step is 1/127 of the row's largest;
// this tiny model's weights, std 0.3, amplify it). The greedy decode through the GEMV kernel
// continues the prompt.
TEST_P(WeightQuant, Fp8LogitsMatchTheDequantisedModelAndStayWithinTolerance) {
  ModelConfig c = tiny(GetParam());
  c.tied = false;  // dequantising the head's weight for the reference leaves the embedding alone
  Decoder model(c, cpu_backend()), deq(c, cpu_backend()), fp32(c, cpu_backend());
  for (Decoder* m : {&model, &deq, &fp32}) m->params().init(1);
  int64_t elems = 0, channels = 0;
  for (const Decoder::LinearInfo& l : deq.linears()) {
    float* p = deq.params().ptr(weight_of(deq, l.name));
    std::vector<uint8_t> q(size_t(l.in) * l.out);
    std::vector<float> s(size_t(l.out));
    ASSERT_TRUE(cpu::quantize_fp8_rows(p, l.out, l.in, q.data(), s.data()));
    for (int n = 0; n < l.out; ++n)
      for (int k = 0; k < l.in; ++k)
        p[size_t(n) * l.in + k] =
            s[size_t(n)] * cpu::fp8_decode(cpu::Fp8Format::E4M3, q[size_t(n) * l.in + k]);
    elems += int64_t(l.in) * l.out;
    channels += l.out;
  }
  QuantizedWeights q(model, WeightType::FP8);
  EXPECT_EQ(q.stored_bytes(), elems + 4 * channels);
  std::vector<int32_t> seq = prompt(40, 4);  // 40 rows: prefill's blocked GEMM
  const std::vector<float> l8 = all_logits(model, seq), ld = all_logits(deq, seq),
                           lf = all_logits(fp32, seq);
  EXPECT_LE(max_abs_diff(l8, ld), 1e-5 * max_abs(ld));
  std::vector<int32_t> short_seq = prompt(12, 5);  // 12 rows: the decode GEMV
  EXPECT_LE(max_abs_diff(all_logits(model, short_seq), all_logits(deq, short_seq)),
            1e-5 * max_abs(all_logits(deq, short_seq)));
  const double r = rms(l8, lf) / rms(lf, std::vector<float>(lf.size(), 0.f));
  const double d = max_abs_diff(l8, lf) / max_abs(lf);
  std::printf("fp8 logits vs fp32: rms %.4f of the fp32 rms, max %.4f of the largest\n", r, d);
  EXPECT_LE(r, 0.20);
  EXPECT_LE(d, 0.35);
  EXPECT_GT(d, 0);
  DecoderRunner run(model);
  EXPECT_EQ(engine_greedy(run, 2, 8)[0].size(), 8u);
}

// A seeded request gives the same text alone and beside others with low-precision weights:
// alone its two completions decode two rows at a time on the GEMV; beside ten others twelve at a
// time, on CPUs with AMX on the tile path (kernels/cpu/gemm_lowp_amx.h), whose sums differ from
// the GEMV's only in the order and rounding of fp32 additions.
TEST_P(WeightQuant, SeededSamplingIgnoresTheRestOfTheBatch) {
  Decoder model(tiny(GetParam()), cpu_backend());
  model.params().init(3);
  for (WeightType t : {WeightType::BF16, WeightType::INT8, WeightType::FP8}) {
    QuantizedWeights q(model, t);
    DecoderRunner runner(model);
    SamplingParams p;
    p.temperature = 1.0f, p.top_p = 0.9f, p.max_tokens = 24, p.seed = 42, p.ignore_eos = true;
    p.n = 2;
    SamplingParams o = p;
    o.seed.reset();
    o.n = 1;
    const auto alone = seeded_completions(runner, p, o, 0),
               crowded = seeded_completions(runner, p, o, 10);
    ASSERT_EQ(alone.size(), 2u);
    EXPECT_EQ(alone.at(0).size(), 24u);
    EXPECT_EQ(alone, crowded) << weight_type_name(t);
    EXPECT_NE(alone.at(0), alone.at(1));  // the n completions differ
  }
}

// A weight that is not finite has no int8 or fp8 scale: refused, naming the layer.
TEST(WeightQuantBadInput, Int8AndFp8RefuseNonFiniteWeights) {
  for (WeightType t : {WeightType::INT8, WeightType::FP8}) {
    Decoder model(tiny(Family::GPT2), cpu_backend());
    model.params().init(1);
    model.params().ptr("blocks.1.mlp.fc.weight")[3] = std::nanf("");
    try {
      QuantizedWeights q(model, t);
      ADD_FAILURE() << "a NaN weight was quantised as " << weight_type_name(t);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("linear layer blocks.1.mlp.fc: a weight row holds NaN"),
                std::string::npos)
          << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, WeightQuant, testing::Values(Family::GPT2, Family::Llama),
                         [](const testing::TestParamInfo<Family>& i) {
                           return i.param == Family::GPT2 ? "gpt2" : "llama";
                         });

TEST(WeightQuantNames, UnknownTypeIsAnError) {
  EXPECT_EQ(weight_type_from_name("bf16"), WeightType::BF16);
  EXPECT_EQ(weight_type_from_name("fp8"), WeightType::FP8);
  EXPECT_THROW(weight_type_from_name("fp4"), Error);
}
