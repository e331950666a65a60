// The Llama-layout families through Hugging Face's layout (Llama, Qwen2, Qwen3, Mistral, and
// the mixtures of experts Mixtral and Qwen3-MoE in Loom's MoE layers):
// config.json keys and tensor names as transformers writes them, and logits against a float64
// torch reference written from the published architectures (hf_reference.py, run with Debian's
// /usr/bin/python3 and python3-torch; skipped with a message without them), both ways: a Loom
// model exported and read by the reference, and the reference's own files imported by Loom.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckpt/hf_export.h"
#include "ckpt/model_bridge.h"
#include "ckpt/test_util.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "model/decoder.h"

namespace loom::ckpt {
namespace {

using testing::ScratchDir;

const char* const kFamilies[] = {"llama",   "qwen2",     "qwen3", "mistral",
                                 "mixtral", "qwen3_moe", "phi3"};
const char* const kGemmas[] = {"gemma", "gemma2", "gemma3_text"};

bool have_torch() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

#define SKIP_WITHOUT_TORCH()                                                             \
  if (!have_torch())                                                                     \
  GTEST_SKIP() << "/usr/bin/python3 cannot import torch (Debian's python3-torch, which " \
                  "scripts/setup.sh installs): the torch reference is not run"

void run_reference(const std::vector<std::string>& args) {
  std::string cmd = "/usr/bin/python3 " LOOM_HF_REFERENCE;
  for (const std::string& a : args) cmd += " '" + a + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// The reference's logits of `tokens` (positions 0..n-1) for the model in `dir`.
std::vector<float> reference_logits(const std::string& dir, const std::vector<int32_t>& tokens,
                                    int vocab) {
  std::string list;
  for (int32_t t : tokens) {
    if (!list.empty()) list += ',';
    list += std::to_string(t);
  }
  const std::string out = dir + "/reference_logits.bin";
  run_reference({"logits", dir, list, out});
  const std::string bytes = read_file(out);
  std::vector<float> logits(tokens.size() * size_t(vocab));
  EXPECT_EQ(bytes.size(), logits.size() * sizeof(float));
  std::memcpy(logits.data(), bytes.data(), std::min(bytes.size(), logits.size() * 4));
  return logits;
}

std::vector<float> loom_logits(Decoder& m, const std::vector<int32_t>& tokens) {
  const int n = int(tokens.size());
  std::vector<int32_t> pos(tokens.size()), cu = {0, n};
  std::vector<int> rows(tokens.size());
  for (int i = 0; i < n; ++i) pos[size_t(i)] = rows[size_t(i)] = i;
  ModelInput in{tokens.data(), nullptr, pos.data(), cu.data(), n, 1};
  std::vector<float> logits(size_t(n) * m.config().vocab);
  m.forward_logits(in, rows, logits.data());
  return logits;
}

void expect_close(const std::vector<float>& loom, const std::vector<float>& ref,
                  const std::string& what) {
  ASSERT_EQ(loom.size(), ref.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::fabs(double(loom[i]) - ref[i]) / (1 + std::fabs(ref[i])));
  EXPECT_LT(worst, 1e-4) << what << ": logits differ from the reference by up to " << worst;
}

std::vector<int32_t> some_tokens(int n, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t(uniform_at(17, 1, uint64_t(i)) * vocab));
  return t;
}

// A small model of `family` (GQA 4/2, head_dim 8, two layers) with every weight random.
ModelConfig small(const std::string& family) {
  ModelConfig c = model_preset("tiny-llama");
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.head_dim = 8;
  c.d_ff = 48;
  c.vocab = 320;
  c.max_seq = 128;
  c.rope_theta = 1e6f;
  c.norm_eps = 1e-6f;
  c.qkv_bias = family == "qwen2";
  c.tied = family == "qwen2";
  c.qk_norm = family == "qwen3" || family == "qwen3_moe";
  c.sliding_window = family == "mistral" || family == "phi3" ? 64 : 0;
  if (family == "phi3") c.hf_family = "phi3";
  if (family == "mixtral" || family == "qwen3_moe") {
    c.n_experts = 4;
    c.top_k = 2;
  }
  return c;
}

// A small Gemma (head_dim 16, so H * D = 64 is not d_model) in Loom's options: Gemma 2 with
// caps and windows that bind on 40 tokens, Gemma 3 with q/k norms and every third layer global.
ModelConfig small_gemma(const std::string& family) {
  ModelConfig c = small("llama");
  c.head_dim = 16;
  c.tied = true;
  c.geglu = true;
  c.embed_scale = true;
  c.rope_theta = 10000.f;
  if (family == "gemma") return c;
  c.n_layer = 4;
  c.sandwich_norm = true;
  c.sliding_window = 8;
  c.attn_scalar = 24.f;
  if (family == "gemma2") {
    c.window_pattern = 2;
    c.attn_softcap = 1.5f;
    c.final_softcap = 3.f;
  } else {
    c.qk_norm = true;
    c.window_pattern = 3;
    c.rope_theta = 1e6f;
    c.rope_local_theta = 10000.f;
  }
  return c;
}

void randomise(ParamSet& P) {
  for (const ParamInfo& p : P.infos()) {
    const bool norm = p.name.find("norm") != std::string::npos;
    for (int64_t i = 0; i < p.numel; ++i) {
      const float u = uniform_at(5, 3, uint64_t(p.offset + i)) - 0.5f;
      P.data()[p.offset + i] = norm ? 1.f + 0.4f * u : 0.8f * u;
    }
  }
}

TEST(HfFamilies, ConfigJsonRoundTripsAndNamesTheFamily) {
  const char* const classes[] = {"LlamaForCausalLM",   "Qwen2ForCausalLM",   "Qwen3ForCausalLM",
                                 "MistralForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM",
                                 "Phi3ForCausalLM"};
  for (size_t i = 0; i < std::size(kFamilies); ++i) {
    const char* f = kFamilies[i];
    const HfModelShape s = hf_shape_of(small(f));
    EXPECT_EQ(s.family, f);
    const Json c = hf_config_json(s, DType::BF16);
    EXPECT_EQ(c.at("model_type").as_string(), f);
    EXPECT_EQ(c.at("architectures").as_array()[0].as_string(), classes[i]);
    EXPECT_EQ(hf_shape_from_config(Json::parse(c.dump()), "config.json"), s) << f;
    EXPECT_EQ(model_config_of(s).fingerprint(), small(f).fingerprint()) << f;
  }
  const Json q2 = hf_config_json(hf_shape_of(small("qwen2")), DType::F32);
  EXPECT_EQ(q2.at("architectures").as_array()[0].as_string(), "Qwen2ForCausalLM");
  EXPECT_FALSE(q2.at("use_sliding_window").as_bool());
  const Json m = hf_config_json(hf_shape_of(small("mistral")), DType::F32);
  EXPECT_EQ(m.at("sliding_window").as_int(), 64);
  EXPECT_EQ(m.at("architectures").as_array()[0].as_string(), "MistralForCausalLM");
}

TEST(HfFamilies, TensorNamesAreTransformers) {
  const auto q2 = hf_param_shapes(hf_shape_of(small("qwen2")));
  EXPECT_EQ(q2.at("model.layers.1.self_attn.k_proj.bias"), (Shape{16}));
  EXPECT_FALSE(q2.count("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_FALSE(q2.count("lm_head.weight"));  // tied
  const auto q3 = hf_param_shapes(hf_shape_of(small("qwen3")));
  EXPECT_EQ(q3.at("model.layers.0.self_attn.q_norm.weight"), (Shape{8}));
  EXPECT_EQ(q3.at("model.layers.0.self_attn.k_norm.weight"), (Shape{8}));
  EXPECT_FALSE(q3.count("model.layers.0.self_attn.q_proj.bias"));
}

// Phi-3's fused q/k/v and gate/up are Loom's rows exactly.
TEST(HfFamilies, Phi3FusedTensorsAreLoomsRows) {
  const HfModelShape s = hf_shape_of(small("phi3"));
  const auto names = hf_param_shapes(s);
  EXPECT_EQ(names.at("model.layers.1.self_attn.qkv_proj.weight"), (Shape{64, 32}));
  EXPECT_EQ(names.at("model.layers.1.mlp.gate_up_proj.weight"), (Shape{96, 32}));
  EXPECT_FALSE(names.count("model.layers.1.self_attn.q_proj.weight"));
  const Json c = hf_config_json(s, DType::F32);
  EXPECT_EQ(c.at("sliding_window").as_int(), 64);
  EXPECT_EQ(model_config_of(s).hf_family, "phi3");
  Json partial = Json::parse(c.dump());
  partial["partial_rotary_factor"] = Json(0.5);
  EXPECT_THROW(hf_shape_from_config(partial, "config.json"), Error);
  Json longrope = Json::parse(c.dump());
  longrope["rope_scaling"] = Json::parse(R"({"type": "longrope", "short_factor": [1.0]})");
  try {
    hf_shape_from_config(longrope, "config.json");
    ADD_FAILURE() << "longrope accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_scaling type 'longrope' is not supported"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfFamilies, ExpertTensorNamesAreTransformers) {
  const auto mx = hf_param_shapes(hf_shape_of(small("mixtral")));
  EXPECT_EQ(mx.at("model.layers.1.block_sparse_moe.gate.weight"), (Shape{4, 32}));
  EXPECT_EQ(mx.at("model.layers.1.block_sparse_moe.experts.3.w1.weight"), (Shape{48, 32}));
  EXPECT_EQ(mx.at("model.layers.1.block_sparse_moe.experts.3.w2.weight"), (Shape{32, 48}));
  EXPECT_EQ(mx.at("model.layers.1.block_sparse_moe.experts.3.w3.weight"), (Shape{48, 32}));
  EXPECT_FALSE(mx.count("model.layers.1.mlp.gate_proj.weight"));
  const auto q = hf_param_shapes(hf_shape_of(small("qwen3_moe")));
  EXPECT_EQ(q.at("model.layers.0.mlp.gate.weight"), (Shape{4, 32}));
  EXPECT_EQ(q.at("model.layers.0.mlp.experts.2.up_proj.weight"), (Shape{48, 32}));
  EXPECT_EQ(q.at("model.layers.0.self_attn.q_norm.weight"), (Shape{8}));
  const Json c = hf_config_json(hf_shape_of(small("qwen3_moe")), DType::F32);
  EXPECT_EQ(c.at("num_experts").as_int(), 4);
  EXPECT_EQ(c.at("moe_intermediate_size").as_int(), 48);
  EXPECT_TRUE(c.at("norm_topk_prob").as_bool());
  // Loom's expert e holds gate then up rows in w1: exported as that expert's two matrices.
  const ModelConfig cfg = small("mixtral");
  const HfModelShape s = hf_shape_of(cfg);
  TensorMap loom;
  uint32_t seed = 1;
  for (const auto& [name, shape] : loom_param_shapes(s))
    loom[name] = testing::random_tensor(shape, DType::F32, seed++);
  const TensorMap hf = loom_to_hf(s, loom, DType::F32);
  const float* w1 = loom.at("blocks.0.moe.experts.w1").data<float>();
  EXPECT_EQ(hf.at("model.layers.0.block_sparse_moe.experts.2.w3.weight").data<float>()[5],
            w1[(2 * 96 + 48) * 32 + 5]);
  const TensorMap back = hf_to_loom(s, hf, DType::F32, "test");
  for (const auto& [name, t] : loom) EXPECT_TRUE(testing::same_tensor(back.at(name), t)) << name;
}

TEST(HfFamilies, GemmaConfigJsonRoundTripsAndNamesTheFamily) {
  const char* const classes[] = {"GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"};
  for (size_t i = 0; i < std::size(kGemmas); ++i) {
    const char* f = kGemmas[i];
    const ModelConfig c = small_gemma(f);
    const HfModelShape s = hf_shape_of(c);
    EXPECT_EQ(s.family, f);
    const Json j = hf_config_json(s, DType::BF16);
    EXPECT_EQ(j.at("model_type").as_string(), f);
    EXPECT_EQ(j.at("architectures").as_array()[0].as_string(), classes[i]);
    EXPECT_EQ(j.at("hidden_activation").as_string(), "gelu_pytorch_tanh");
    EXPECT_EQ(hf_shape_from_config(Json::parse(j.dump()), "config.json"), s) << f;
    const ModelConfig back = model_config_of(s);
    EXPECT_EQ(back.fingerprint(), c.fingerprint()) << f;
    EXPECT_EQ(back.window_pattern, c.window_pattern) << f;
    EXPECT_EQ(back.attn_softcap, c.attn_softcap) << f;
    EXPECT_EQ(back.final_softcap, c.final_softcap) << f;
    EXPECT_EQ(back.attn_scalar, c.attn_scalar) << f;
    EXPECT_EQ(back.rope_local_theta, c.rope_local_theta) << f;
    EXPECT_TRUE(back.geglu && back.embed_scale) << f;
  }
  const Json g2 = hf_config_json(hf_shape_of(small_gemma("gemma2")), DType::F32);
  EXPECT_EQ(g2.at("attn_logit_softcapping").as_double(), 1.5);
  EXPECT_EQ(g2.at("final_logit_softcapping").as_double(), 3.0);
  EXPECT_EQ(g2.at("query_pre_attn_scalar").as_double(), 24.0);
  EXPECT_EQ(g2.at("layer_types").as_array()[1].as_string(), "full_attention");
  const Json g3 = hf_config_json(hf_shape_of(small_gemma("gemma3_text")), DType::F32);
  EXPECT_EQ(g3.at("sliding_window_pattern").as_int(), 3);
  EXPECT_EQ(g3.at("rope_local_base_freq").as_double(), 10000.0);
  EXPECT_TRUE(g3.at("final_logit_softcapping").is_null());
  // Gemma 2's published defaults: caps 50 and 30, query_pre_attn_scalar 256, every other layer.
  Json d = Json::parse(g2.dump());
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "layer_types",
                        "query_pre_attn_scalar"})
    d.as_object().erase(k);
  const HfModelShape s = hf_shape_from_config(d, "config.json");
  EXPECT_EQ(s.attn_softcap, 50.f);
  EXPECT_EQ(s.final_softcap, 30.f);
  EXPECT_EQ(s.attn_scalar, 256.f);
  EXPECT_EQ(s.window_pattern, 2);
}

TEST(HfFamilies, GemmaTensorNamesAndNormOffsets) {
  const HfModelShape s = hf_shape_of(small_gemma("gemma2"));
  const auto names = hf_param_shapes(s);
  EXPECT_EQ(names.at("model.layers.3.pre_feedforward_layernorm.weight"), (Shape{32}));
  EXPECT_EQ(names.at("model.layers.3.post_feedforward_layernorm.weight"), (Shape{32}));
  EXPECT_EQ(names.at("model.layers.0.self_attn.q_proj.weight"), (Shape{64, 32}));
  EXPECT_FALSE(names.count("lm_head.weight"));
  EXPECT_TRUE(hf_param_shapes(hf_shape_of(small_gemma("gemma3_text")))
                  .count("model.layers.0.self_attn.q_norm.weight"));
  TensorMap loom;
  uint32_t seed = 1;
  for (const auto& [name, shape] : loom_param_shapes(s))
    loom[name] = testing::random_tensor(shape, DType::F32, seed++);
  const TensorMap hf = loom_to_hf(s, loom, DType::F32);
  // Gemma 2's post_attention_layernorm is the attention output's norm; weights are Loom's - 1.
  EXPECT_EQ(hf.at("model.layers.1.post_attention_layernorm.weight").data<float>()[3],
            loom.at("blocks.1.attn.post_norm.weight").data<float>()[3] - 1.f);
  EXPECT_EQ(hf.at("model.layers.1.pre_feedforward_layernorm.weight").data<float>()[3],
            loom.at("blocks.1.norm2.weight").data<float>()[3] - 1.f);
  const TensorMap back = hf_to_loom(s, hf, DType::F32, "test");
  for (const auto& [name, t] : loom) {
    const float* a = t.data<float>();
    const float* b = back.at(name).data<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-6f * (1 + std::fabs(a[i]))) << name;
  }
}

TEST(HfFamilies, GemmaExportedAndImportedLogitsMatchTheTorchReference) {
  SKIP_WITHOUT_TORCH();
  for (const char* f : kGemmas) {
    {
      ScratchDir dir;
      const ModelConfig c = small_gemma(f);
      Decoder m(c, cpu_backend());
      m.params().init(1);
      randomise(m.params());
      export_hf(dir.path(), hf_shape_of(c), m.params().tensors("export"));
      const auto tokens = some_tokens(40, c.vocab);
      expect_close(loom_logits(m, tokens), reference_logits(dir.path(), tokens, c.vocab),
                   cat(f, " exported"));
    }
    ScratchDir dir;
    run_reference({"make", dir.path(), f, "7"});
    const HfModel hf = import_hf(dir.path());
    EXPECT_EQ(hf.shape.family, f);
    const ModelConfig c = model_config_of(hf.shape);
    EXPECT_EQ(c.fingerprint(), small_gemma(f).fingerprint()) << f;
    Decoder m(c, cpu_backend());
    for (auto& [name, t] : m.params().tensors("import")) t.copy_from(hf.params.at(name));
    const auto tokens = some_tokens(48, c.vocab);
    expect_close(loom_logits(m, tokens), reference_logits(dir.path(), tokens, c.vocab),
                 cat(f, " imported"));
  }
}

TEST(HfFamilies, ExportedLogitsMatchTheTorchReference) {
  SKIP_WITHOUT_TORCH();
  for (const char* f : kFamilies) {
    ScratchDir dir;
    const ModelConfig c = small(f);
    Decoder m(c, cpu_backend());
    m.params().init(1);
    randomise(m.params());
    export_hf(dir.path(), hf_shape_of(c), m.params().tensors("export"));
    const auto tokens = some_tokens(40, c.vocab);
    expect_close(loom_logits(m, tokens), reference_logits(dir.path(), tokens, c.vocab),
                 cat(f, " exported"));
  }
}

TEST(HfFamilies, ImportedReferenceFilesGiveItsLogits) {
  SKIP_WITHOUT_TORCH();
  for (const char* f : kFamilies) {
    ScratchDir dir;
    run_reference({"make", dir.path(), f, "7"});
    const HfModel hf = import_hf(dir.path());
    EXPECT_EQ(hf.shape.family, f);
    const ModelConfig c = model_config_of(hf.shape);
    Decoder m(c, cpu_backend());
    for (auto& [name, t] : m.params().tensors("import")) t.copy_from(hf.params.at(name));
    const auto tokens = some_tokens(48, c.vocab);
    expect_close(loom_logits(m, tokens), reference_logits(dir.path(), tokens, c.vocab),
                 cat(f, " imported"));
  }
}

// The reference's window binds past 64 positions: Loom refuses those positions rather than
// attending over the wrong keys.
TEST(HfFamilies, MistralWindowIsKeptAndRefusedPastIt) {
  Decoder m(small("mistral"), cpu_backend());
  m.params().init(1);
  EXPECT_THROW(loom_logits(m, some_tokens(65, 320)), Error);
}

Json llama_like(const char* type) {
  Json j = hf_config_json(hf_shape_of(small("llama")), DType::F32);
  j["model_type"] = Json(type);
  j.as_object().erase("architectures");
  return j;
}

void expect_refused(const Json& config, const std::string& needle) {
  try {
    hf_shape_from_config(config, "dir/config.json");
    ADD_FAILURE() << "accepted; expected an error with: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(HfFamilies, UnsupportedArchitectureFieldsAreNamed) {
  expect_refused(llama_like("gemma7"), "dir/config.json: model_type 'gemma7' is not supported");
  Json a = llama_like("qwen2");
  a["architectures"] = Json(Json::Array{Json("Qwen2ForSequenceClassification")});
  expect_refused(a, "architectures[0] 'Qwen2ForSequenceClassification' is not supported");
  Json w = llama_like("qwen2");
  w["use_sliding_window"] = Json(true);
  expect_refused(w, "use_sliding_window true is not supported");
  Json b = llama_like("qwen3");
  b["attention_bias"] = Json(true);
  expect_refused(b, "attention_bias true is not supported");
  Json act = llama_like("mistral");
  act["hidden_act"] = Json("gelu");
  expect_refused(act, "hidden_act 'gelu' is not supported");
  // A window as long as the context never binds: read as none.
  Json full = llama_like("mistral");
  full["sliding_window"] = Json(128);
  EXPECT_EQ(hf_shape_from_config(full, "config.json").sliding_window, 0);
}

TEST(HfFamilies, UnsupportedExpertFieldsAreNamed) {
  Json q = hf_config_json(hf_shape_of(small("qwen3_moe")), DType::F32);
  q["norm_topk_prob"] = Json(false);
  expect_refused(q, "norm_topk_prob false is not supported");
  Json step = hf_config_json(hf_shape_of(small("qwen3_moe")), DType::F32);
  step["decoder_sparse_step"] = Json(2);
  expect_refused(step, "decoder_sparse_step other than 1 is not supported");
  Json one = hf_config_json(hf_shape_of(small("mixtral")), DType::F32);
  one["num_experts_per_tok"] = Json(1);
  expect_refused(one, "num_experts_per_tok = 1 is not supported");
  expect_refused(llama_like("qwen2_moe"), "its shared expert");
}

TEST(HfFamilies, Transformers5RopeParametersAreRead) {
  Json j = llama_like("qwen3");
  j.as_object().erase("rope_theta");
  j.as_object().erase("rope_scaling");
  j["head_dim"] = Json(8);
  j["rope_parameters"] = Json::parse(R"({"rope_type": "default", "rope_theta": 5000000.0})");
  const HfModelShape s = hf_shape_from_config(j, "config.json");
  EXPECT_EQ(s.rope_theta, 5e6f);
  EXPECT_FALSE(s.rope_scaling.enabled());
}

TEST(HfFamilies, UnsupportedGemmaFieldsAreNamed) {
  // Fresh objects (a Json copy shares its contents).
  const auto g2 = [] { return hf_config_json(hf_shape_of(small_gemma("gemma2")), DType::F32); };
  const auto g3 = [] {
    return hf_config_json(hf_shape_of(small_gemma("gemma3_text")), DType::F32);
  };
  Json act = g2();
  act["hidden_activation"] = Json("gelu");
  expect_refused(act, "hidden_activation 'gelu' is not supported");
  Json lin = g3();
  lin["rope_scaling"] = Json::parse(R"({"rope_type": "linear", "factor": 8.0})");
  expect_refused(lin, "rope_scaling type 'linear' is not supported");
  Json bi = g3();
  bi["use_bidirectional_attention"] = Json(true);
  expect_refused(bi, "use_bidirectional_attention true is not supported");
  Json types = g2();
  types["layer_types"].as_array()[2] = Json("full_attention");
  expect_refused(types, "layer_types is not supported");
  Json four = g2();
  four["layer_types"].as_array()[1] = Json("sliding_attention");
  expect_refused(four, "layer_types other than alternating windowed and global layers");
  Json mm = g3();
  mm["model_type"] = Json("gemma3");
  expect_refused(mm, "model_type 'gemma3' (Gemma3ForConditionalGeneration");
  Json arch = g3();
  arch["architectures"] = Json(Json::Array{Json("Gemma3ForSequenceClassification")});
  expect_refused(arch, "architectures[0] 'Gemma3ForSequenceClassification' is not supported");
  Json bias = g2();
  bias["attention_bias"] = Json(true);
  expect_refused(bias, "attention_bias true is not supported");
}

}  // namespace
}  // namespace loom::ckpt
