// Embeddings (infer/embeddings.h) against references computed without them: a Llama model's
// final hidden states from the float64 torch reference (tests/ckpt/hf_reference.py, skipped
// with a message when Debian's python3-torch is missing), and for both families the model's
// own logits, which are the pooled state times the head (linear, so the mean of a sequence's
// logits is the mean state times the head too).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/hf_export.h"
#include "ckpt/model_bridge.h"
#include "core/error.h"
#include "core/fs.h"
#include "infer/embeddings.h"
#include "infer/engine.h"
#include "infer/infer_test_util.h"
#include "infer/model_runner.h"
#include "model/decoder.h"
#include "temp_dir.h"

namespace loom::infer {
namespace {

using test::prompt;
using test::tiny;

double norm_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

// Largest |a - b| / (1 + |b|).
double worst_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double w = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    w = std::max(w, std::fabs(a[i] - b[i]) / (1 + std::fabs(b[i])));
  return w;
}

std::vector<float> logits_of(Decoder& m, const std::vector<int32_t>& tokens) {
  const int n = int(tokens.size());
  std::vector<int32_t> pos(tokens.size()), cu = {0, n};
  std::vector<int> rows(tokens.size());
  for (int i = 0; i < n; ++i) pos[size_t(i)] = rows[size_t(i)] = i;
  ModelInput in{tokens.data(), nullptr, pos.data(), cu.data(), n, 1};
  std::vector<float> logits(size_t(n) * m.config().vocab);
  m.forward_logits(in, rows, logits.data());
  return logits;
}

// Raw pooled vector times the head's weight [V, C], in double.
std::vector<double> times_head(Decoder& m, const std::vector<float>& h) {
  const ModelConfig& c = m.config();
  const float* w = m.params().ptr(c.tied ? "embed.wte" : "head.weight");
  std::vector<double> out(size_t(c.vocab), 0.0);
  for (int v = 0; v < c.vocab; ++v)
    for (int j = 0; j < c.d_model; ++j)
      out[size_t(v)] += double(w[int64_t(v) * c.d_model + j]) * h[j];
  return out;
}

TEST(Embeddings, PooledStatesTimesTheHeadAreTheModelsLogits) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder m(tiny(f), cpu_backend());
    m.params().init(3);
    const std::vector<int32_t> t = prompt(23, 7);
    const std::vector<float> logits = logits_of(m, t);
    const int V = m.config().vocab, n = int(t.size());
    EmbeddingOptions raw;
    raw.normalize = false;
    raw.pooling = Pooling::Last;
    const auto last = embed(m, {t}, raw);
    std::vector<double> want_last(logits.end() - V, logits.end());
    EXPECT_LT(worst_diff(times_head(m, last[0]), want_last), 1e-5) << int(f);
    raw.pooling = Pooling::Mean;
    const auto mean = embed(m, {t}, raw);
    std::vector<double> want_mean(size_t(V), 0.0);
    for (int r = 0; r < n; ++r)
      for (int v = 0; v < V; ++v) want_mean[size_t(v)] += logits[size_t(r) * V + v] / double(n);
    EXPECT_LT(worst_diff(times_head(m, mean[0]), want_mean), 1e-5) << int(f);
    // The two poolings are different vectors.
    double apart = 0;
    for (size_t j = 0; j < last[0].size(); ++j)
      apart = std::max(apart, double(std::fabs(last[0][j] - mean[0][j])));
    EXPECT_GT(apart, 1e-2) << int(f);
  }
}

bool have_torch() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

// The torch reference's final hidden states [tokens, C] of the HF model in `dir`.
std::vector<double> reference_hidden(const std::string& dir, const std::vector<int32_t>& tokens,
                                     int C) {
  std::string list;
  for (int32_t t : tokens) {
    if (!list.empty()) list += ',';
    list += std::to_string(t);
  }
  const std::string out = dir + "/hidden.bin";
  const std::string cmd =
      cat("/usr/bin/python3 " LOOM_HF_REFERENCE " hidden '", dir, "' ", list, " '", out, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string bytes = read_file(out);
  std::vector<float> h(tokens.size() * size_t(C));
  EXPECT_EQ(bytes.size(), h.size() * sizeof(float));
  std::memcpy(h.data(), bytes.data(), std::min(bytes.size(), h.size() * sizeof(float)));
  return std::vector<double>(h.begin(), h.end());
}

TEST(Embeddings, MatchTheTorchReferenceOfTheFinalHiddenState) {
  if (!have_torch())
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (Debian's python3-torch, which "
                    "scripts/setup.sh installs): the torch reference is not run";
  loom::test::TempDir dir("emb");
  ModelConfig c = tiny(Family::Llama);
  c.norm_eps = 1e-6f;
  Decoder m(c, cpu_backend());
  m.params().init(5);
  ckpt::export_hf(dir.path, ckpt::hf_shape_of(c), m.params().tensors("export"));
  const std::vector<std::vector<int32_t>> inputs = {prompt(17, 2), prompt(5, 3), prompt(40, 4)};
  const int C = c.d_model;
  std::vector<std::vector<double>> hidden;  // each input's, from one run of the reference each
  for (const auto& in : inputs) hidden.push_back(reference_hidden(dir.path, in, C));
  for (Pooling p : {Pooling::Last, Pooling::Mean})
    for (bool normalize : {true, false}) {
      EmbeddingOptions opt;
      opt.pooling = p;
      opt.normalize = normalize;
      opt.max_batch_tokens = 30;  // the first two share a pass, the third runs alone
      const auto got = embed(m, inputs, opt);
      ASSERT_EQ(got.size(), inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        const std::vector<double>& h = hidden[i];
        const int n = int(inputs[i].size());
        std::vector<double> want(size_t(C), 0.0);
        const int first = p == Pooling::Last ? n - 1 : 0;
        for (int r = first; r < n; ++r)
          for (int j = 0; j < C; ++j) want[size_t(j)] += h[size_t(r) * C + j] / (n - first);
        double nrm = 0;
        for (double v : want) nrm += v * v;
        if (normalize)
          for (double& v : want) v /= std::sqrt(nrm);
        EXPECT_LT(worst_diff(std::vector<double>(got[i].begin(), got[i].end()), want), 1e-5)
            << pooling_name(p) << " normalize " << normalize << " input " << i;
        if (normalize) {
          EXPECT_NEAR(norm_of(got[i]), 1.0, 1e-6);
        }
      }
    }
}

TEST(Embeddings, AVectorDoesNotDependOnItsBatch) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(4);
  const std::vector<std::vector<int32_t>> inputs = {prompt(9, 1), prompt(30, 2), prompt(3, 3)};
  EmbeddingOptions opt;
  opt.pooling = Pooling::Mean;
  const auto together = embed(m, inputs, opt);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto alone = embed(m, {inputs[i]}, opt);
    for (size_t j = 0; j < alone[0].size(); ++j)
      EXPECT_NEAR(alone[0][j], together[i][j], 1e-6) << i << " " << j;
  }
}

TEST(Embeddings, BadInputsAreRefusedNamingTheInput) {
  Decoder m(tiny(Family::GPT2), cpu_backend());
  m.params().init(4);
  auto message = [&](const std::vector<std::vector<int32_t>>& in) {
    try {
      embed(m, in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}).find("no inputs"), std::string::npos);
  EXPECT_NE(message({{1, 2}, {}}).find("input 1 is empty"), std::string::npos);
  EXPECT_NE(message({prompt(97, 1)}).find("maximum context length is 96"), std::string::npos);
  EXPECT_NE(message({{1, 64}}).find("token id 64"), std::string::npos);
  EXPECT_EQ(pooling_from_name("mean"), Pooling::Mean);
  EXPECT_THROW(pooling_from_name("cls"), Error);
}

TEST(Embeddings, TheEngineComputesThemBetweenSteps) {
  Decoder m(tiny(Family::Llama), cpu_backend());
  m.params().init(6);
  DecoderRunner runner(m);
  LoomEngine e(runner, EngineConfig{});
  const std::vector<std::vector<int32_t>> inputs = {prompt(12, 1), prompt(4, 2)};
  std::vector<int32_t> generated;
  e.submit(prompt(8, 9), test::greedy(5), [&](const TokenEvent& ev) {
    generated.insert(generated.end(), ev.tokens.begin(), ev.tokens.end());
  });
  EmbeddingResult got;
  int calls = 0;
  e.submit_embeddings(inputs, EmbeddingOptions{}, [&](const EmbeddingResult& r) {
    got = r;
    ++calls;
  });
  e.run_until_idle();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.prompt_tokens, 16);
  EXPECT_EQ(generated.size(), 5u);
  const auto want = embed(m, inputs);
  ASSERT_EQ(got.vectors.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(got.vectors[i], want[i]);
  EXPECT_EQ(e.stats().prompt_tokens_total, 8 + 16);
  EXPECT_EQ(e.in_flight(), 0);
  try {
    e.submit_embeddings({{1}, {}}, EmbeddingOptions{}, [](const EmbeddingResult&) {});
    ADD_FAILURE() << "an empty input was taken";
  } catch (const RequestRejected& r) {
    EXPECT_EQ(r.http_status, 400);
    EXPECT_NE(r.message.find("input 1 is empty"), std::string::npos) << r.message;
  }
}

}  // namespace
}  // namespace loom::infer
