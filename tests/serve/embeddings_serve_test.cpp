// POST /v1/embeddings over loopback: OpenAI's shape for every form of `input`, the vectors equal
// to infer::embed on a second copy of the model (itself checked against the torch reference in
// tests/infer/embeddings_test.cpp), base64 as little-endian float32, bad requests as 400s
// naming the field; --served-model-name's names; /metrics under vLLM's names, parsed from the
// exposition format and checked against the requests made.
#include <cmath>
#include <cstring>
#include <map>

#include "infer/embeddings.h"
#include "serve/embeddings_api.h"
#include "serve/server_fixture.h"

using namespace loom;
using namespace loom::serve_test;

namespace {

std::vector<float> floats_of(const Json& a) {
  std::vector<float> v;
  for (const Json& x : a.as_array()) v.push_back(float(x.as_double()));
  return v;
}

// Base64 decoded by a plain table walk, then read as little-endian float32.
std::vector<float> from_base64(const std::string& s) {
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : s) {
    if (ch == '=') break;
    const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char* at = std::strchr(table, ch);
    EXPECT_TRUE(at && ch) << "not base64: " << ch;
    if (!at) return {};
    acc = (acc << 6) | uint32_t(at - table);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(char((acc >> bits) & 0xff));
    }
  }
  EXPECT_EQ(bytes.size() % 4, 0u);
  std::vector<float> v(bytes.size() / 4);
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u = 0;
    for (int b = 0; b < 4; ++b) u |= uint32_t(uint8_t(bytes[i * 4 + size_t(b)])) << (8 * b);
    std::memcpy(&v[i], &u, 4);
  }
  return v;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double w = a.size() == b.size() ? 0 : 1e9;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    w = std::max(w, double(std::fabs(a[i] - b[i])));
  return w;
}

struct EmbeddingsFixture : Fixture {
  std::unique_ptr<Decoder> ref;  // the same weights as the served model, its own buffers
  std::vector<float> reference(const std::vector<int32_t>& ids, const infer::EmbeddingOptions& o) {
    if (!ref) {
      ref = std::make_unique<Decoder>(model->config(), cpu_backend());
      ref->params().init(1);
    }
    return infer::embed(*ref, {ids}, o)[0];
  }
  std::vector<int32_t> encode(const std::string& s) {
    std::vector<int32_t> ids;
    tok.encode(s, ids, false);
    return ids;
  }
};

}  // namespace

TEST_F(EmbeddingsFixture, EveryFormOfInputGetsOpenAIsShapeAndTheModelsVectors) {
  options.embedding_dimensions = 32;
  start();
  const infer::EmbeddingOptions last;
  auto [s1, one] =
      post("/v1/embeddings", R"({"model": "tiny", "input": "hello world", "user": "u"})");
  ASSERT_EQ(s1, 200) << one.dump();
  EXPECT_EQ(one.at("object").as_string(), "list");
  EXPECT_EQ(one.at("model").as_string(), "tiny");
  ASSERT_EQ(one.at("data").size(), 1u);
  const Json& d0 = one.at("data").as_array()[0];
  EXPECT_EQ(d0.at("object").as_string(), "embedding");
  EXPECT_EQ(d0.at("index").as_int(), 0);
  const std::vector<float> v = floats_of(d0.at("embedding"));
  EXPECT_LT(max_diff(v, reference(encode("hello world"), last)), 1e-5);
  double norm = 0;
  for (float x : v) norm += double(x) * x;
  EXPECT_NEAR(norm, 1.0, 1e-5);
  EXPECT_EQ(one.at("usage").at("prompt_tokens").as_int(), int64_t(encode("hello world").size()));
  EXPECT_EQ(one.at("usage").at("total_tokens").as_int(),
            one.at("usage").at("prompt_tokens").as_int());

  auto [s2, many] =
      post("/v1/embeddings", R"({"input": ["a", "bcd", "hello world"], "dimensions": 32})");
  ASSERT_EQ(s2, 200) << many.dump();
  ASSERT_EQ(many.at("data").size(), 3u);
  EXPECT_EQ(many.at("data").as_array()[2].at("index").as_int(), 2);
  EXPECT_LT(max_diff(floats_of(many.at("data").as_array()[2].at("embedding")), v), 1e-6);
  EXPECT_LT(max_diff(floats_of(many.at("data").as_array()[1].at("embedding")),
                     reference(encode("bcd"), last)),
            1e-5);

  auto [s3, ids] = post("/v1/embeddings", R"({"input": [5, 6, 7, 200]})");
  ASSERT_EQ(s3, 200) << ids.dump();
  EXPECT_LT(max_diff(floats_of(ids.at("data").as_array()[0].at("embedding")),
                     reference({5, 6, 7, 200}, last)),
            1e-5);
  EXPECT_EQ(ids.at("usage").at("prompt_tokens").as_int(), 4);
  auto [s4, lists] =
      post("/v1/embeddings", R"({"input": [[5, 6, 7, 200], [9]], "encoding_format": "base64"})");
  ASSERT_EQ(s4, 200) << lists.dump();
  ASSERT_EQ(lists.at("data").size(), 2u);
  const std::vector<float> b0 =
      from_base64(lists.at("data").as_array()[0].at("embedding").as_string());
  EXPECT_LT(max_diff(b0, floats_of(ids.at("data").as_array()[0].at("embedding"))), 0.0 + 1e-9);
  EXPECT_LT(max_diff(from_base64(lists.at("data").as_array()[1].at("embedding").as_string()),
                     reference({9}, last)),
            1e-5);
  EXPECT_EQ(lists.at("usage").at("prompt_tokens").as_int(), 5);
}

TEST(EmbeddingsApi, Float32Base64IsLittleEndianBytes) {
  // 1.0f is 00 00 80 3f; -2.0f is 00 00 00 c0.
  EXPECT_EQ(serve::float32_base64({1.0f}), "AACAPw==");
  EXPECT_EQ(serve::float32_base64({1.0f, -2.0f}), "AACAPwAAAMA=");
  EXPECT_EQ(serve::float32_base64({}), "");
}

TEST_F(EmbeddingsFixture, MeanPoolingAndRawVectorsAreTheEnginesOptions) {
  options.embedding_dimensions = 32;
  options.embedding.pooling = infer::Pooling::Mean;
  options.embedding.normalize = false;
  start();
  auto [st, r] = post("/v1/embeddings", R"({"input": "hello world"})");
  ASSERT_EQ(st, 200) << r.dump();
  const std::vector<float> mean = floats_of(r.at("data").as_array()[0].at("embedding"));
  EXPECT_LT(max_diff(mean, reference(encode("hello world"), options.embedding)), 1e-5);
  EXPECT_GT(max_diff(mean, reference(encode("hello world"), infer::EmbeddingOptions{})), 1e-3);
}

TEST_F(EmbeddingsFixture, BadRequestsAre400sNamingTheField) {
  options.embedding_dimensions = 32;
  start();
  const std::pair<const char*, const char*> cases[] = {
      {R"({})", "input"},
      {R"({"input": ""})", "input"},
      {R"({"input": []})", "input"},
      {R"({"input": [[]]})", "input"},
      {R"({"input": [[1, 2], []]})", "input"},
      {R"({"input": ["a", 5]})", "input"},
      {R"({"input": [1, "a"]})", "input"},
      {R"({"input": 7})", "input"},
      {R"({"input": [-1]})", "input"},
      {R"({"input": [999]})", "input"},  // outside the vocabulary of 260
      {R"({"input": "a", "encoding_format": "hex"})", "encoding_format"},
      {R"({"input": "a", "dimensions": 16})", "dimensions"},
      {R"({"input": "a", "dimensions": "32"})", "dimensions"},
      {R"({"input": "a", "user": 5})", "user"},
      {R"({"input": "a", "truncate_prompt_tokens": 4})", "truncate_prompt_tokens"},
      {R"({"input": "a", "model": 3})", "model"},
  };
  for (const auto& [body, param] : cases) {
    auto [st, e] = post("/v1/embeddings", body);
    EXPECT_EQ(st, 400) << body << " " << e.dump();
    if (st == 400) {
      EXPECT_EQ(e.at("error").at("param").as_string(), param) << body;
      EXPECT_EQ(e.at("error").at("type").as_string(), "invalid_request_error") << body;
    }
  }
  // Longer than the context (256 tokens).
  std::string ids = "[";
  for (int i = 0; i < 257; ++i) {
    if (i) ids += ',';
    ids += std::to_string(i % 200);
  }
  auto [st, e] = post("/v1/embeddings", R"({"input": )" + ids + "]}");
  EXPECT_EQ(st, 400) << e.dump();
  if (st == 400) {
    EXPECT_EQ(e.at("error").at("param").as_string(), "input");
    EXPECT_NE(e.at("error").at("message").as_string().find("256"), std::string::npos);
  }
  auto [s404, nf] = post("/v1/embeddings", R"({"input": "a", "model": "nope"})");
  EXPECT_EQ(s404, 404);
  EXPECT_EQ(nf.at("error").at("code").as_string(), "model_not_found");
  auto [sbad, bad] = post("/v1/embeddings", "not json");
  EXPECT_EQ(sbad, 400) << bad.dump();
}

TEST_F(Fixture, ServedModelNamesAreAcceptedAndListed) {
  options.model_aliases = {"second", "third"};
  start();
  auto g = client().Get("/v1/models");
  ASSERT_TRUE(g);
  const Json models = Json::parse(g->body);
  ASSERT_EQ(models.at("data").size(), 3u);
  EXPECT_EQ(models.at("data").as_array()[0].at("id").as_string(), "tiny");
  EXPECT_EQ(models.at("data").as_array()[1].at("id").as_string(), "second");
  EXPECT_EQ(models.at("data").as_array()[2].at("id").as_string(), "third");
  auto [st, c] = post("/v1/completions", R"({"model": "third", "prompt": "ab", "max_tokens": 2})");
  ASSERT_EQ(st, 200) << c.dump();
  EXPECT_EQ(c.at("model").as_string(), "tiny");  // responses report the first name
  auto [se, e] = post("/v1/embeddings", R"({"model": "second", "input": "ab"})");
  ASSERT_EQ(se, 200) << e.dump();
  EXPECT_EQ(e.at("model").as_string(), "tiny");
  auto [s404, nf] = post("/v1/completions", R"({"model": "fourth", "prompt": "ab"})");
  EXPECT_EQ(s404, 404);
  EXPECT_EQ(nf.at("error").at("param").as_string(), "model");
}

namespace {

// One sample of the Prometheus text format: name, labels, value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
  std::string text;  // the value as written
};

// Parses every sample line (`name{k="v",...} value`); a line that does not parse fails the test.
std::vector<Sample> parse_exposition(const std::string& body) {
  std::vector<Sample> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    const std::string line = body.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        EXPECT_NE(eq, std::string::npos) << line;
        if (eq == std::string::npos) return out;
        const std::string key = line.substr(i, eq - i);
        EXPECT_EQ(line[eq + 1], '"') << line;
        std::string v;
        size_t k = eq + 2;
        for (; k < line.size() && line[k] != '"'; ++k) {
          if (line[k] == '\\' && k + 1 < line.size()) ++k;
          v += line[k];
        }
        s.labels[key] = v;
        i = k + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;
    }
    EXPECT_EQ(line[i], ' ') << line;
    s.text = line.substr(i + 1);
    char* stop = nullptr;
    s.value = std::strtod(s.text.c_str(), &stop);
    EXPECT_TRUE(stop && *stop == 0 && !s.text.empty()) << line;
    out.push_back(s);
  }
  return out;
}

// The value of the sample `name` whose labels include `labels` (NaN when none does).
double value_of(const std::vector<Sample>& samples, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : labels) all &= s.labels.count(k) && s.labels.at(k) == v;
    if (all) return s.value;
  }
  return std::nan("");
}

}  // namespace

TEST_F(Fixture, MetricsUnderVllmNamesCountTheRequestsMade) {
  start();
  int64_t prompt = 0, generated = 0, gaps = 0;
  std::map<std::string, int> reasons;
  // Prefill tokens computed: each of a prompt's n completions computes it (prompts this short
  // fill no block of the prefix cache); a completion of max_tokens 0 computes nothing.
  const std::pair<const char*, int> requests[] = {
      {R"({"prompt": "hello", "max_tokens": 5, "temperature": 0, "ignore_eos": true})", 1},
      {R"({"prompt": ["abc", "defgh"], "max_tokens": 3, "temperature": 0, "ignore_eos": true,
           "n": 2})",
       2},
      {R"({"prompt": "hello", "max_tokens": 0})", 0}};
  for (const auto& [body, computed] : requests) {
    auto [st, c] = post("/v1/completions", body);
    ASSERT_EQ(st, 200) << c.dump();
    prompt += computed * c.at("usage").at("prompt_tokens").as_int();
    generated += c.at("usage").at("completion_tokens").as_int();
    for (const Json& ch : c.at("choices").as_array()) ++reasons[ch.at("finish_reason").as_string()];
  }
  // Greedy without speculation: one token per step, so one gap per token after a choice's
  // first.
  gaps = (5 - 1) + 4 * (3 - 1);
  auto [se, e] = post("/v1/embeddings", R"({"input": ["abc", "de"]})");
  ASSERT_EQ(se, 200) << e.dump();
  prompt += e.at("usage").at("prompt_tokens").as_int();
  ++reasons["stop"];
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  const std::vector<Sample> samples = parse_exposition(m->body);
  const std::map<std::string, std::string> model = {{"model_name", "tiny"}};
  for (const Sample& s : samples) {
    if (s.name.rfind("vllm:", 0) == 0) {
      EXPECT_EQ(s.labels.count("model_name"), 1u) << s.name;
    }
  }
  EXPECT_EQ(value_of(samples, "vllm:prompt_tokens_total", model), double(prompt));
  EXPECT_EQ(value_of(samples, "vllm:generation_tokens_total", model), double(generated));
  EXPECT_EQ(generated, 5 + 4 * 3);
  EXPECT_EQ(value_of(samples, "vllm:num_requests_running", model), 0);
  EXPECT_EQ(value_of(samples, "vllm:num_requests_waiting", model), 0);
  EXPECT_EQ(value_of(samples, "vllm:kv_cache_usage_perc", model), 0);
  for (const char* r : {"stop", "length", "abort"})
    EXPECT_EQ(value_of(samples, "vllm:request_success_total",
                       {{"model_name", "tiny"}, {"finished_reason", r}}),
              reasons[r])
        << r;
  EXPECT_EQ(reasons["length"], 1 + 4 + 1);
  // Histograms: counts of what was observed, cumulative buckets ending in +Inf = count.
  EXPECT_EQ(value_of(samples, "vllm:time_to_first_token_seconds_count", model), 2);
  EXPECT_EQ(value_of(samples, "vllm:e2e_request_latency_seconds_count", model), 4);
  EXPECT_EQ(value_of(samples, "vllm:inter_token_latency_seconds_count", model), double(gaps));
  EXPECT_EQ(value_of(samples, "vllm:time_per_output_token_seconds_count", model), 2);
  for (const char* h : {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                        "vllm:e2e_request_latency_seconds"}) {
    double prev = 0;
    int buckets = 0;
    for (const Sample& s : samples)
      if (s.name == std::string(h) + "_bucket") {
        EXPECT_GE(s.value, prev) << h;
        prev = s.value;
        ++buckets;
        EXPECT_EQ(s.labels.at("model_name"), "tiny");
      }
    EXPECT_GT(buckets, 2) << h;
    EXPECT_EQ(value_of(samples, std::string(h) + "_bucket", {{"le", "+Inf"}}),
              value_of(samples, std::string(h) + "_count"))
        << h;
    EXPECT_GT(value_of(samples, std::string(h) + "_sum"), 0) << h;
  }
  EXPECT_EQ(value_of(samples, "vllm:spec_decode_num_draft_tokens_total", model), 0);
  // Integers are written as integers.
  for (const Sample& s : samples) {
    if (s.name == "vllm:prompt_tokens_total") {
      EXPECT_EQ(s.text, std::to_string(prompt));
    }
  }
}
