#include "ckpt/hf_export.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <set>

#include "ckpt/test_util.h"
#include "core/error.h"

namespace loom::ckpt {
namespace {

using testing::error_of;
using testing::random_tensor;
using testing::same_tensor;
using testing::ScratchDir;
namespace fs = std::filesystem;

HfModelShape tiny_gpt2() {
  HfModelShape s;
  s.family = "gpt2";
  s.n_layer = 2;
  s.d_model = 8;
  s.n_head = 2;
  s.n_kv_head = 2;
  s.head_dim = 4;
  s.d_ff = 32;
  s.vocab = 11;
  s.max_seq = 16;
  s.norm_eps = 1e-5f;
  s.tied = true;
  s.bos_token_id = s.eos_token_id = 10;
  return s;
}

HfModelShape tiny_llama() {
  HfModelShape s;
  s.family = "llama";
  s.n_layer = 2;
  s.d_model = 8;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.head_dim = 4;  // n_head * head_dim = 16 != d_model: o_proj is not square
  s.d_ff = 12;
  s.vocab = 13;
  s.max_seq = 32;
  s.norm_eps = 1e-6f;
  s.rope_theta = 500000.f;
  s.tied = false;
  return s;
}

TensorMap random_params(const HfModelShape& s, uint32_t seed) {
  TensorMap m;
  for (const auto& [name, shape] : loom_param_shapes(s))
    m[name] = random_tensor(shape, DType::F32, seed++);
  return m;
}

// Element (i, j) of a 2-D fp32 tensor.
float at(const Tensor& t, int64_t i, int64_t j) {
  return t.data<float>()[i * t.dim(1) + j];
}

TEST(HfExport, LoomParameterListMatchesTheModelLayout) {
  auto g = loom_param_shapes(tiny_gpt2());
  EXPECT_EQ(g.size(), 2u + 12u * 2 + 2u);  // wte, wpe; 12 per block; final norm w+b
  EXPECT_EQ(g.at("embed.wpe"), Shape({16, 8}));
  EXPECT_EQ(g.at("blocks.1.attn.qkv.weight"), Shape({24, 8}));
  EXPECT_EQ(g.at("blocks.1.mlp.fc.weight"), Shape({32, 8}));
  EXPECT_EQ(g.at("blocks.1.mlp.proj.weight"), Shape({8, 32}));
  EXPECT_FALSE(g.count("head.weight"));
  auto l = loom_param_shapes(tiny_llama());
  EXPECT_EQ(l.size(), 1u + 6u * 2 + 1u + 1u);  // wte; 6 per block; final norm; head
  EXPECT_EQ(l.at("blocks.0.attn.qkv.weight"), Shape({(4 + 2 * 2) * 4, 8}));
  EXPECT_EQ(l.at("blocks.0.attn.proj.weight"), Shape({8, 16}));
  EXPECT_EQ(l.at("blocks.0.mlp.fc.weight"), Shape({24, 8}));
  EXPECT_EQ(l.at("head.weight"), Shape({13, 8}));
  EXPECT_FALSE(l.count("embed.wpe"));
  EXPECT_FALSE(l.count("blocks.0.norm1.bias"));
}

TEST(HfExport, Gpt2NamesShapesAndTransposes) {
  ScratchDir dir;
  const HfModelShape s = tiny_gpt2();
  const TensorMap p = random_params(s, 1);
  export_hf(dir.path(), s, p, DType::F32);
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  SafetensorsReader r(dir / "model.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "pt");

  std::vector<std::string> want = {"transformer.wte.weight", "transformer.wpe.weight",
                                   "transformer.ln_f.weight", "transformer.ln_f.bias"};
  for (int i = 0; i < 2; ++i)
    for (const char* n :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
      want.push_back(cat("transformer.h.", i, ".", n));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(r.names(), want);

  EXPECT_EQ(r.entry("transformer.wte.weight").shape, Shape({11, 8}));
  EXPECT_EQ(r.entry("transformer.wpe.weight").shape, Shape({16, 8}));
  EXPECT_EQ(r.entry("transformer.h.1.attn.c_attn.weight").shape, Shape({8, 24}));  // [C, 3C]
  EXPECT_EQ(r.entry("transformer.h.1.attn.c_attn.bias").shape, Shape({24}));
  EXPECT_EQ(r.entry("transformer.h.1.attn.c_proj.weight").shape, Shape({8, 8}));
  EXPECT_EQ(r.entry("transformer.h.1.mlp.c_fc.weight").shape, Shape({8, 32}));  // [C, 4C]
  EXPECT_EQ(r.entry("transformer.h.1.mlp.c_proj.weight").shape, Shape({32, 8}));
  for (const auto& e : r.entries()) EXPECT_EQ(e.dtype, DType::F32) << e.name;

  // Conv1D weights are the transposes of Loom's [out, in] weights.
  auto check_transposed = [&](const std::string& hf, const std::string& loom) {
    Tensor h = r.load(hf);
    const Tensor& l = p.at(loom);
    for (int64_t i = 0; i < l.dim(0); ++i)
      for (int64_t j = 0; j < l.dim(1); ++j)
        ASSERT_EQ(at(h, j, i), at(l, i, j)) << hf << " (" << i << ", " << j << ")";
  };
  check_transposed("transformer.h.1.attn.c_attn.weight", "blocks.1.attn.qkv.weight");
  check_transposed("transformer.h.0.attn.c_proj.weight", "blocks.0.attn.proj.weight");
  check_transposed("transformer.h.0.mlp.c_fc.weight", "blocks.0.mlp.fc.weight");
  check_transposed("transformer.h.1.mlp.c_proj.weight", "blocks.1.mlp.proj.weight");
  EXPECT_TRUE(
      same_tensor(r.load("transformer.h.1.attn.c_attn.bias"), p.at("blocks.1.attn.qkv.bias")));
  EXPECT_TRUE(same_tensor(r.load("transformer.wte.weight"), p.at("embed.wte")));
  EXPECT_TRUE(same_tensor(r.load("transformer.ln_f.bias"), p.at("final_norm.bias")));
}

TEST(HfExport, Gpt2ConfigJson) {
  ScratchDir dir;
  HfModelShape s = tiny_gpt2();
  export_hf(dir.path(), s, random_params(s, 1), DType::BF16);
  Json c = Json::parse(read_file(dir / "config.json"));
  EXPECT_EQ(c.at("model_type").as_string(), "gpt2");
  EXPECT_EQ(c.at("architectures").as_array().at(0).as_string(), "GPT2LMHeadModel");
  EXPECT_EQ(c.at("n_embd").as_int(), 8);
  EXPECT_EQ(c.at("n_layer").as_int(), 2);
  EXPECT_EQ(c.at("n_head").as_int(), 2);
  EXPECT_EQ(c.at("n_positions").as_int(), 16);
  EXPECT_EQ(c.at("n_ctx").as_int(), 16);
  EXPECT_EQ(c.at("vocab_size").as_int(), 11);
  EXPECT_TRUE(c.at("n_inner").is_null()) << "d_ff == 4 * d_model is HF's default";
  EXPECT_EQ(c.at("activation_function").as_string(), "gelu_new");
  EXPECT_TRUE(c.at("tie_word_embeddings").as_bool());
  EXPECT_EQ(c.at("torch_dtype").as_string(), "bfloat16");
  EXPECT_EQ(c.at("bos_token_id").as_int(), 10);
  EXPECT_NE(read_file(dir / "config.json").find("\"layer_norm_epsilon\": 1e-05"), std::string::npos)
      << "floats are written as their shortest decimal";
  EXPECT_TRUE(hf_shape_from_config(c, "config.json") == s);

  s.d_ff = 20;
  EXPECT_EQ(hf_config_json(s, DType::F32).at("n_inner").as_int(), 20);
  EXPECT_TRUE(hf_shape_from_config(hf_config_json(s, DType::F32), "c") == s);
}

TEST(HfExport, Gpt2RoundTripIsExact) {
  ScratchDir dir;
  const HfModelShape s = tiny_gpt2();
  const TensorMap p = random_params(s, 7);
  export_hf(dir.path(), s, p, DType::F32);
  HfModel m = import_hf(dir.path());
  EXPECT_TRUE(m.shape == s);
  ASSERT_EQ(m.params.size(), p.size());
  for (const auto& [n, t] : p) EXPECT_TRUE(same_tensor(m.params.at(n), t)) << n;
}

TEST(HfExport, LlamaNamesSplitsAndConfig) {
  ScratchDir dir;
  const HfModelShape s = tiny_llama();
  const TensorMap p = random_params(s, 3);
  export_hf(dir.path(), s, p, DType::F32);
  SafetensorsReader r(dir / "model.safetensors");
  std::vector<std::string> want = {"model.embed_tokens.weight", "model.norm.weight",
                                   "lm_head.weight"};
  for (int i = 0; i < 2; ++i)
    for (const char* n :
         {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      want.push_back(cat("model.layers.", i, ".", n));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(r.names(), want);

  const Tensor& qkv = p.at("blocks.1.attn.qkv.weight");  // [32, 8]: q rows 0-15, k 16-23, v 24-31
  EXPECT_TRUE(same_tensor(r.load("model.layers.1.self_attn.q_proj.weight"), qkv.slice(0, 16)));
  EXPECT_TRUE(same_tensor(r.load("model.layers.1.self_attn.k_proj.weight"), qkv.slice(16, 24)));
  EXPECT_TRUE(same_tensor(r.load("model.layers.1.self_attn.v_proj.weight"), qkv.slice(24, 32)));
  const Tensor& fc = p.at("blocks.0.mlp.fc.weight");  // [24, 8]: gate rows 0-11, up 12-23
  EXPECT_TRUE(same_tensor(r.load("model.layers.0.mlp.gate_proj.weight"), fc.slice(0, 12)));
  EXPECT_TRUE(same_tensor(r.load("model.layers.0.mlp.up_proj.weight"), fc.slice(12, 24)));
  EXPECT_EQ(r.entry("model.layers.0.self_attn.o_proj.weight").shape, Shape({8, 16}));
  EXPECT_TRUE(same_tensor(r.load("model.layers.0.self_attn.o_proj.weight"),
                          p.at("blocks.0.attn.proj.weight")));
  EXPECT_EQ(r.entry("model.layers.0.mlp.down_proj.weight").shape, Shape({8, 12}));
  EXPECT_TRUE(same_tensor(r.load("lm_head.weight"), p.at("head.weight")));

  Json c = Json::parse(read_file(dir / "config.json"));
  EXPECT_EQ(c.at("model_type").as_string(), "llama");
  EXPECT_EQ(c.at("architectures").as_array().at(0).as_string(), "LlamaForCausalLM");
  EXPECT_EQ(c.at("hidden_size").as_int(), 8);
  EXPECT_EQ(c.at("intermediate_size").as_int(), 12);
  EXPECT_EQ(c.at("num_hidden_layers").as_int(), 2);
  EXPECT_EQ(c.at("num_attention_heads").as_int(), 4);
  EXPECT_EQ(c.at("num_key_value_heads").as_int(), 2);
  EXPECT_EQ(c.at("head_dim").as_int(), 4);
  EXPECT_EQ(c.at("max_position_embeddings").as_int(), 32);
  EXPECT_EQ(c.at("vocab_size").as_int(), 13);
  EXPECT_DOUBLE_EQ(c.at("rms_norm_eps").as_double(), 1e-6);
  EXPECT_DOUBLE_EQ(c.at("rope_theta").as_double(), 500000.0);
  EXPECT_FALSE(c.at("tie_word_embeddings").as_bool());
  EXPECT_EQ(c.at("hidden_act").as_string(), "silu");
  EXPECT_EQ(c.at("torch_dtype").as_string(), "float32");
  EXPECT_FALSE(c.contains("bos_token_id"));
}

TEST(HfExport, LlamaRoundTripIsExactTiedAndUntied) {
  for (bool tied : {false, true}) {
    ScratchDir dir;
    HfModelShape s = tiny_llama();
    s.tied = tied;
    const TensorMap p = random_params(s, 11);
    export_hf(dir.path(), s, p, DType::F32);
    EXPECT_EQ(SafetensorsReader(dir / "model.safetensors").contains("lm_head.weight"), !tied);
    HfModel m = import_hf(dir.path());
    EXPECT_TRUE(m.shape == s);
    ASSERT_EQ(m.params.size(), p.size());
    for (const auto& [n, t] : p) EXPECT_TRUE(same_tensor(m.params.at(n), t)) << n;
  }
}

TEST(HfExport, Bf16ExportRoundsToNearestEven) {
  ScratchDir dir;
  const HfModelShape s = tiny_gpt2();
  const TensorMap p = random_params(s, 5);
  export_hf(dir.path(), s, p, DType::BF16);
  SafetensorsReader r(dir / "model.safetensors");
  EXPECT_EQ(r.entry("transformer.wte.weight").dtype, DType::BF16);
  Tensor wte = r.load("transformer.wte.weight");
  for (int64_t i = 0; i < wte.numel(); ++i)
    ASSERT_EQ(wte.data<uint16_t>()[i], f32_to_bf16(p.at("embed.wte").data<float>()[i]));
  HfModel m = import_hf(dir.path(), DType::F32);
  const Tensor& qkv = m.params.at("blocks.0.attn.qkv.weight");
  const Tensor& orig = p.at("blocks.0.attn.qkv.weight");
  for (int64_t i = 0; i < qkv.numel(); ++i)
    ASSERT_EQ(qkv.data<float>()[i], round_bf16(orig.data<float>()[i]));
  HfModel kept = import_hf(dir.path(), DType::BF16);
  EXPECT_EQ(kept.params.at("embed.wte").dtype(), DType::BF16);
}

TEST(HfExport, ShardedExportAndImport) {
  ScratchDir dir;
  const HfModelShape s = tiny_llama();
  const TensorMap p = random_params(s, 21);
  export_hf(dir.path(), s, p, DType::F32, /*max_shard_bytes=*/1024);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  Json index = Json::parse(read_file(dir / "model.safetensors.index.json"));
  const auto& wm = index.at("weight_map").as_object();
  EXPECT_EQ(wm.size(), hf_param_shapes(s).size());
  std::set<std::string> files;
  for (const auto& [n, f] : wm) files.insert(f.as_string());
  ASSERT_GT(files.size(), 2u);
  uint64_t total = 0;
  for (const std::string& f : files) {
    EXPECT_TRUE(fs::exists(dir / f)) << f;
    EXPECT_NE(f.find(cat("-of-0000", files.size(), ".safetensors")), std::string::npos) << f;
    SafetensorsReader r(dir / f);
    for (const auto& e : r.entries()) total += e.end - e.begin;
  }
  EXPECT_EQ(index.at("metadata").at("total_size").as_int(), static_cast<int64_t>(total));

  HfModel m = import_hf(dir.path());
  for (const auto& [n, t] : p) EXPECT_TRUE(same_tensor(m.params.at(n), t)) << n;

  // Re-exporting as one file removes the shards so loaders cannot pick up stale weights.
  export_hf(dir.path(), s, p, DType::F32);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  for (const std::string& f : files) EXPECT_FALSE(fs::exists(dir / f)) << f;
}

TEST(HfExport, ImportsHubStyleGpt2Files) {
  // The Hub's gpt2 stores names without "transformer." and carries attn.bias mask buffers.
  ScratchDir dir;
  const HfModelShape s = tiny_gpt2();
  const TensorMap p = random_params(s, 31);
  TensorMap hf = loom_to_hf(s, p, DType::F32);
  TensorMap hub;
  for (auto& [n, t] : hf) hub[n.substr(std::string("transformer.").size())] = t;
  hub["h.0.attn.bias"] = Tensor::zeros({1, 1, 16, 16});
  hub["h.1.attn.bias"] = Tensor::zeros({1, 1, 16, 16});
  write_safetensors(dir / "model.safetensors", hub, {{"format", "pt"}});
  write_file_atomic(dir / "config.json", hf_config_json(s, DType::F32).dump(2));
  HfModel m = import_hf(dir.path());
  for (const auto& [n, t] : p) EXPECT_TRUE(same_tensor(m.params.at(n), t)) << n;
}

TEST(HfExport, ExportRejectsWrongParameters) {
  ScratchDir dir;
  const HfModelShape s = tiny_gpt2();
  TensorMap missing = random_params(s, 1);
  missing.erase("blocks.1.mlp.fc.bias");
  std::string e = error_of([&] { export_hf(dir.path(), s, missing); });
  EXPECT_NE(e.find("'blocks.1.mlp.fc.bias'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  TensorMap wrong = random_params(s, 1);
  wrong["blocks.0.attn.qkv.weight"] = Tensor::zeros({8, 24});
  e = error_of([&] { export_hf(dir.path(), s, wrong); });
  EXPECT_NE(e.find("'blocks.0.attn.qkv.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[8, 24]"), std::string::npos) << e;
  EXPECT_NE(e.find("[24, 8]"), std::string::npos) << e;

  TensorMap extra = random_params(s, 1);
  extra["head.weight"] = Tensor::zeros({11, 8});  // the model is tied
  e = error_of([&] { export_hf(dir.path(), s, extra); });
  EXPECT_NE(e.find("unexpected tensor 'head.weight'"), std::string::npos) << e;

  e = error_of([&] { export_hf(dir.path(), s, random_params(s, 1), DType::F8E4M3); });
  EXPECT_NE(e.find("fp8_e4m3"), std::string::npos) << e;

  HfModelShape gqa = s;
  gqa.n_kv_head = 1;
  e = error_of([&] { export_hf(dir.path(), gqa, random_params(s, 1)); });
  EXPECT_NE(e.find("GPT-2"), std::string::npos) << e;
  HfModelShape unknown = s;
  unknown.family = "mamba";
  e = error_of([&] { export_hf(dir.path(), unknown, random_params(s, 1)); });
  EXPECT_NE(e.find("mamba"), std::string::npos) << e;

  EXPECT_TRUE(fs::is_empty(dir.path())) << "failed exports must not write anything";
}

TEST(HfExport, ImportRejectsBadDirectories) {
  ScratchDir dir;
  const HfModelShape s = tiny_llama();
  const TensorMap p = random_params(s, 1);
  TensorMap hf = loom_to_hf(s, p, DType::F32);
  const std::string config = hf_config_json(s, DType::F32).dump(2);
  write_file_atomic(dir / "config.json", config);

  std::string e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;

  TensorMap missing = hf;
  missing.erase("model.layers.1.self_attn.k_proj.weight");
  write_safetensors(dir / "model.safetensors", missing);
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("'model.layers.1.self_attn.k_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  TensorMap wrong = hf;
  wrong["model.layers.0.mlp.up_proj.weight"] = Tensor::zeros({8, 12});
  write_safetensors(dir / "model.safetensors", wrong);
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("'model.layers.0.mlp.up_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[8, 12]"), std::string::npos) << e;
  EXPECT_NE(e.find("[12, 8]"), std::string::npos) << e;

  TensorMap extra = hf;
  extra["model.layers.0.self_attn.q_proj.bias"] = Tensor::zeros({16});
  write_safetensors(dir / "model.safetensors", extra);
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"), std::string::npos)
      << e;

  write_safetensors(dir / "model.safetensors", hf);
  EXPECT_NO_THROW(import_hf(dir.path()));

  Json c = Json::parse(config);
  c["model_type"] = Json("falcon");
  write_file_atomic(dir / "config.json", c.dump());
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("model_type 'falcon'"), std::string::npos) << e;

  c = Json::parse(config);
  c["rope_scaling"]["rope_type"] = Json("yarn");  // llama3 is supported (hf_import_test.cpp)
  write_file_atomic(dir / "config.json", c.dump());
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("rope_scaling"), std::string::npos) << e;

  c = Json::parse(config);
  c["hidden_size"] = Json("eight");
  write_file_atomic(dir / "config.json", c.dump());
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("'hidden_size'"), std::string::npos) << e;

  c = Json::parse(config);
  c.as_object().erase("vocab_size");
  write_file_atomic(dir / "config.json", c.dump());
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("'vocab_size'"), std::string::npos) << e;

  write_file_atomic(dir / "config.json", "{\"model_type\": ");
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("config.json:1:"), std::string::npos) << e;

  fs::remove(dir / "config.json");
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
}

TEST(HfExport, ImportChecksTheShardIndex) {
  ScratchDir dir;
  const HfModelShape s = tiny_llama();
  export_hf(dir.path(), s, random_params(s, 2), DType::F32, 1024);
  Json index = Json::parse(read_file(dir / "model.safetensors.index.json"));
  // Point one tensor at a file that does not hold it.
  auto& wm = index["weight_map"];
  const std::string moved = "model.norm.weight";
  const std::string other_file = wm.at("model.embed_tokens.weight").as_string();
  ASSERT_NE(wm.at(moved).as_string(), other_file);
  wm[moved] = Json(other_file);
  write_file_atomic(dir / "model.safetensors.index.json", index.dump());
  std::string e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;
  EXPECT_NE(e.find("'model.norm.weight'"), std::string::npos) << e;

  wm[moved] = Json("../elsewhere.safetensors");
  write_file_atomic(dir / "model.safetensors.index.json", index.dump());
  e = error_of([&] { import_hf(dir.path()); });
  EXPECT_NE(e.find("not a file in"), std::string::npos) << e;
}

// A sharded bf16 directory imported into bf16 parameters: every tensor's bits as the files hold
// them (no fp32 round trip); a missing or truncated shard, and a tensor the index leaves out,
// are errors naming the file or the tensor.
TEST(HfExport, ShardedBf16ImportKeepsTheBitsAndNamesWhatIsMissing) {
  ScratchDir dir;
  const HfModelShape s = tiny_llama();
  export_hf(dir.path(), s, random_params(s, 4), DType::BF16, 1024);
  const HfModel m = import_hf(dir.path(), DType::BF16);
  const TensorMap hf = loom_to_hf(s, m.params, DType::BF16);
  Json index = Json::parse(read_file(dir / "model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, f] : index.at("weight_map").as_object()) {
    files.insert(f.as_string());
    SafetensorsReader r(dir / f.as_string());
    EXPECT_TRUE(same_tensor(r.view(name), hf.at(name))) << name;
    EXPECT_EQ(r.entry(name).dtype, DType::BF16);
  }
  ASSERT_GT(files.size(), 2u);
  for (const auto& [name, t] : m.params) EXPECT_EQ(t.dtype(), DType::BF16) << name;

  const std::string shard = dir / *files.begin();
  const std::string bytes = read_file(shard);
  write_file_atomic(shard, bytes.substr(0, bytes.size() / 2));
  std::string e = error_of([&] { import_hf(dir.path(), DType::BF16); });
  EXPECT_NE(e.find(*files.begin()), std::string::npos) << e;
  fs::remove(shard);
  e = error_of([&] { import_hf(dir.path(), DType::BF16); });
  EXPECT_NE(e.find(*files.begin()), std::string::npos) << e;
  write_file_atomic(shard, bytes);

  index["weight_map"].as_object().erase("model.norm.weight");
  write_file_atomic(dir / "model.safetensors.index.json", index.dump());
  e = error_of([&] { import_hf(dir.path(), DType::BF16); });
  EXPECT_NE(e.find("'model.norm.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

TEST(HfExport, ConfigDefaultsOfOlderLlamaConfigs) {
  // Older configs omit head_dim, num_key_value_heads and rope_theta.
  Json c = Json::object();
  c["model_type"] = Json("llama");
  c["hidden_size"] = Json(64);
  c["intermediate_size"] = Json(172);
  c["num_hidden_layers"] = Json(2);
  c["num_attention_heads"] = Json(4);
  c["max_position_embeddings"] = Json(128);
  c["vocab_size"] = Json(100);
  c["rms_norm_eps"] = Json(1e-5);
  c["eos_token_id"] = Json(Json::Array{Json(7), Json(8)});
  HfModelShape s = hf_shape_from_config(c, "config.json");
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_EQ(s.n_kv_head, 4);
  EXPECT_EQ(s.rope_theta, 10000.f);
  EXPECT_FALSE(s.tied);
  EXPECT_EQ(s.eos_token_id, 7);
  EXPECT_EQ(s.bos_token_id, -1);
}

}  // namespace
}  // namespace loom::ckpt
