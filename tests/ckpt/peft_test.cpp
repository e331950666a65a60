// PEFT LoRA files: Loom's fused adapters written as PEFT's per-module ones and read back exactly,
// each module's B A being its rows of the fused update; bad files refused naming key or field.
#include "ckpt/peft.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ckpt/hf_import_util.h"
#include "core/error.h"

namespace loom::ckpt {
namespace {

using testing::error_of;
using testing::random_tensor;
using testing::same_tensor;
using testing::ScratchDir;

// Adapters of rank r on `linears` ((out, in) each), random A and B.
PeftAdapters adapters(const std::vector<std::tuple<std::string, int64_t, int64_t>>& linears, int r,
                      uint32_t seed) {
  PeftAdapters a;
  a.rank = r;
  a.alpha = 16;
  a.rslora = true;
  for (const auto& [name, out, in] : linears) {
    a.tensors[name + ".lora_A"] = random_tensor({r, in}, DType::F32, seed++);
    a.tensors[name + ".lora_B"] = random_tensor({out, r}, DType::F32, seed++);
  }
  return a;
}

// Row i of B times A: one row of the update scale * B A (scale left out).
std::vector<double> delta_row(const Tensor& B, const Tensor& A, int64_t i) {
  std::vector<double> row(size_t(A.dim(1)), 0.0);
  for (int64_t k = 0; k < A.dim(0); ++k)
    for (int64_t j = 0; j < A.dim(1); ++j)
      row[size_t(j)] +=
          double(B.data<float>()[i * B.dim(1) + k]) * A.data<float>()[k * A.dim(1) + j];
  return row;
}

TEST(Peft, LlamaAdaptersSplitIntoModulesAndReadBackExactly) {
  ScratchDir dir;
  const HfModelShape s = testing::tiny_llama3();  // q 8 rows, k and v 4 each; d_ff 12
  PeftAdapters a = adapters({{"blocks.0.attn.qkv", 16, 8},
                             {"blocks.1.attn.qkv", 16, 8},
                             {"blocks.0.mlp.fc", 24, 8},
                             {"blocks.1.mlp.fc", 24, 8},
                             {"blocks.1.mlp.proj", 8, 12},
                             {"head", 13, 8}},
                            4, 7);
  a.dropout = 0.05;
  export_peft(dir.path(), s, a, "meta-llama/Llama-3.2-1B");
  const Json c = Json::parse(read_file(dir / "adapter_config.json"));
  EXPECT_EQ(c.at("peft_type").as_string(), "LORA");
  EXPECT_EQ(c.at("r").as_int(), 4);
  EXPECT_EQ(c.at("lora_alpha").as_double(), 16.0);
  EXPECT_TRUE(c.at("use_rslora").as_bool());
  EXPECT_EQ(c.at("lora_dropout").as_double(), 0.05);
  EXPECT_EQ(c.at("base_model_name_or_path").as_string(), "meta-llama/Llama-3.2-1B");
  // down_proj is adapted in layer 1 only: full module names instead of short ones.
  const std::string targets = c.at("target_modules").dump();
  EXPECT_NE(targets.find("\"model.layers.1.mlp.down_proj\""), std::string::npos) << targets;

  SafetensorsReader r(dir / "adapter_model.safetensors");
  const std::string k = "base_model.model.model.layers.1.self_attn.k_proj";
  ASSERT_TRUE(r.contains(k + ".lora_A.weight"));
  EXPECT_EQ(r.entry(k + ".lora_B.weight").shape, Shape({4, 4}));
  EXPECT_TRUE(r.contains("base_model.model.lm_head.lora_B.weight"));
  EXPECT_TRUE(r.contains("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"));
  // k_proj's update is rows 8..11 of the fused qkv update.
  const Tensor& A = a.tensors.at("blocks.1.attn.qkv.lora_A");
  const Tensor& B = a.tensors.at("blocks.1.attn.qkv.lora_B");
  const Tensor kA = r.load(k + ".lora_A.weight"), kB = r.load(k + ".lora_B.weight");
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(delta_row(kB, kA, i), delta_row(B, A, 8 + i));

  const PeftAdapters back = import_peft(dir.path(), s);
  EXPECT_EQ(back.rank, 4);
  EXPECT_EQ(back.alpha, 16.0);
  EXPECT_TRUE(back.rslora);
  EXPECT_EQ(back.dropout, 0.05);
  ASSERT_EQ(back.tensors.size(), a.tensors.size());
  for (const auto& [n, t] : a.tensors) EXPECT_TRUE(same_tensor(back.tensors.at(n), t)) << n;
}

TEST(Peft, Gpt2ModulesKeepTheirNamesAndShapes) {
  ScratchDir dir;
  HfModelShape s = testing::tiny_llama3();
  s.family = "gpt2";
  s.n_kv_head = s.n_head = 2;
  s.tied = true;
  s.rope_scaling = {};
  const PeftAdapters a =
      adapters({{"blocks.0.attn.qkv", 24, 8}, {"blocks.1.attn.qkv", 24, 8}}, 2, 3);
  export_peft(dir.path(), s, a, "");
  const Json c = Json::parse(read_file(dir / "adapter_config.json"));
  EXPECT_EQ(c.at("target_modules").dump(), "[\"c_attn\"]");
  EXPECT_TRUE(c.at("fan_in_fan_out").as_bool());
  SafetensorsReader r(dir / "adapter_model.safetensors");
  EXPECT_EQ(r.entry("base_model.model.transformer.h.1.attn.c_attn.lora_B.weight").shape,
            Shape({24, 2}));
  const PeftAdapters back = import_peft(dir.path(), s);
  for (const auto& [n, t] : a.tensors) EXPECT_TRUE(same_tensor(back.tensors.at(n), t)) << n;
}

// GPT-2's attn.c_proj and mlp.c_proj share the short name c_proj: adapting attn.proj alone
// writes full module names, which PEFT's match (the name, or a suffix after a dot) applies to
// exactly the adapted modules; adapting every kind in every layer writes the short names.
TEST(Peft, TargetModulesMatchExactlyTheAdaptedModules) {
  HfModelShape s = testing::tiny_llama3();
  s.family = "gpt2";
  s.n_kv_head = s.n_head = 2;
  s.tied = true;
  s.rope_scaling = {};
  const int64_t C = 8, F = s.d_ff;
  std::vector<std::string> all_modules;
  for (int l = 0; l < s.n_layer; ++l)
    for (const char* m : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})
      all_modules.push_back(cat("transformer.h.", l, ".", m));
  // The modules PEFT adapts for target_modules (a list: inject_adapter's
  // check_target_module_exists).
  auto matched = [&](const Json& targets) {
    std::set<std::string> out;
    for (const std::string& m : all_modules)
      for (const Json& t : targets.as_array()) {
        const std::string x = t.as_string();
        if (m == x || (m.size() > x.size() && m.compare(m.size() - x.size(), x.size(), x) == 0 &&
                       m[m.size() - x.size() - 1] == '.'))
          out.insert(m);
      }
    return out;
  };
  {
    ScratchDir dir;
    export_peft(dir.path(), s,
                adapters({{"blocks.0.attn.proj", C, C}, {"blocks.1.attn.proj", C, C}}, 2, 5), "");
    const Json c = Json::parse(read_file(dir / "adapter_config.json"));
    EXPECT_EQ(matched(c.at("target_modules")),
              std::set<std::string>({"transformer.h.0.attn.c_proj", "transformer.h.1.attn.c_proj"}))
        << c.at("target_modules").dump();
  }
  {
    ScratchDir dir;
    std::vector<std::tuple<std::string, int64_t, int64_t>> every;
    for (int l = 0; l < s.n_layer; ++l) {
      every.push_back({cat("blocks.", l, ".attn.qkv"), 3 * C, C});
      every.push_back({cat("blocks.", l, ".attn.proj"), C, C});
      every.push_back({cat("blocks.", l, ".mlp.fc"), F, C});
      every.push_back({cat("blocks.", l, ".mlp.proj"), C, F});
    }
    export_peft(dir.path(), s, adapters(every, 2, 9), "");
    const Json c = Json::parse(read_file(dir / "adapter_config.json"));
    EXPECT_EQ(c.at("target_modules").dump(), "[\"c_attn\", \"c_fc\", \"c_proj\"]");
    EXPECT_EQ(matched(c.at("target_modules")).size(), all_modules.size());
  }
}

// Merging works for any file, including PEFT's own per-module A: each module's rows get
// scale * B A (compared against a float64 product of the fused adapters, and of per-module ones).
TEST(Peft, MergeAddsEachModulesUpdateToItsRows) {
  ScratchDir dir;
  const HfModelShape s = testing::tiny_llama3();
  const PeftAdapters a = adapters({{"blocks.1.attn.qkv", 16, 8}, {"head", 13, 8}}, 4, 21);
  export_peft(dir.path(), s, a, "");
  const TensorMap base = testing::random_params_of(s, 40);
  TensorMap merged;
  for (const auto& [n, t] : base) merged[n] = t.clone();
  merge_peft(dir.path(), s, merged);
  const double scale = 16.0 / 2.0;  // rsLoRA: alpha / sqrt(4)
  for (const std::string linear : {"blocks.1.attn.qkv", "head"}) {
    const Tensor& W0 = base.at(linear + ".weight");
    const Tensor& W1 = merged.at(linear + ".weight");
    for (int64_t i = 0; i < W0.dim(0); ++i) {
      const auto d =
          delta_row(a.tensors.at(linear + ".lora_B"), a.tensors.at(linear + ".lora_A"), i);
      for (int64_t j = 0; j < W0.dim(1); ++j)
        EXPECT_NEAR(W1.data<float>()[i * 8 + j], W0.data<float>()[i * 8 + j] + scale * d[size_t(j)],
                    1e-5)
            << linear << " " << i << "," << j;
    }
  }
  EXPECT_TRUE(
      same_tensor(merged.at("blocks.0.attn.qkv.weight"), base.at("blocks.0.attn.qkv.weight")));
  // PEFT's own q_proj + v_proj: a different A for v, which only a merge can take.
  SafetensorsReader r(dir / "adapter_model.safetensors");
  TensorMap t = r.load_all();
  const std::string v = "base_model.model.model.layers.1.self_attn.v_proj.";
  t[v + "lora_A.weight"] = random_tensor({4, 8}, DType::F32, 77);
  write_safetensors(dir / "adapter_model.safetensors", t);
  EXPECT_THROW(import_peft(dir.path(), s), Error);
  for (const auto& [n, w] : base) merged[n] = w.clone();
  merge_peft(dir.path(), s, merged);
  const Tensor& W0 = base.at("blocks.1.attn.qkv.weight");
  const Tensor& W1 = merged.at("blocks.1.attn.qkv.weight");
  for (int64_t i = 0; i < 4; ++i) {  // v rows 12..15 use v's own A
    const auto d = delta_row(t.at(v + "lora_B.weight"), t.at(v + "lora_A.weight"), i);
    for (int64_t j = 0; j < 8; ++j)
      EXPECT_NEAR(W1.data<float>()[(12 + i) * 8 + j],
                  W0.data<float>()[(12 + i) * 8 + j] + scale * d[size_t(j)], 1e-5);
  }
}

TEST(Peft, FilesLoomCannotRepresentAreRefused) {
  ScratchDir dir;
  const HfModelShape s = testing::tiny_llama3();
  PeftAdapters a = adapters({{"blocks.0.attn.qkv", 16, 8}}, 4, 11);
  export_peft(dir.path(), s, a, "");
  const Json good = Json::parse(read_file(dir / "adapter_config.json"));
  SafetensorsReader r(dir / "adapter_model.safetensors");
  TensorMap t = r.load_all();
  const std::string v = "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight";
  // PEFT's own q_proj + v_proj training: different A per module.
  t[v] = random_tensor({4, 8}, DType::F32, 99);
  write_safetensors(dir / "adapter_model.safetensors", t);
  std::string e = error_of([&] { import_peft(dir.path(), s); });
  EXPECT_NE(e.find("different lora_A"), std::string::npos) << e;
  EXPECT_NE(e.find("blocks.0.attn.qkv"), std::string::npos) << e;
  t.erase(v);
  t["base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight"] = t.begin()->second;
  t["base_model.model.model.layers.5.self_attn.o_proj.lora_A.weight"] = Tensor::zeros({4, 8});
  t["base_model.model.model.layers.5.self_attn.o_proj.lora_B.weight"] = Tensor::zeros({8, 4});
  write_safetensors(dir / "adapter_model.safetensors", t);
  e = error_of([&] { import_peft(dir.path(), s); });
  EXPECT_NE(e.find("'model.layers.5.self_attn.o_proj' is not a linear layer"), std::string::npos)
      << e;
  Json c = Json::parse(good.dump());
  c["use_dora"] = Json(true);
  write_file_atomic(dir / "adapter_config.json", c.dump());
  e = error_of([&] { import_peft(dir.path(), s); });
  EXPECT_NE(e.find("adapter_config.json: 'use_dora'"), std::string::npos) << e;
  c = Json::parse(good.dump());
  c["peft_type"] = Json("IA3");
  write_file_atomic(dir / "adapter_config.json", c.dump());
  e = error_of([&] { import_peft(dir.path(), s); });
  EXPECT_NE(e.find("peft_type \"IA3\""), std::string::npos) << e;
  c = Json::parse(good.dump());
  c["lora_dropout"] = Json(1.0);
  write_file_atomic(dir / "adapter_config.json", c.dump());
  e = error_of([&] { import_peft(dir.path(), s); });
  EXPECT_NE(e.find("'lora_dropout' must lie in [0, 1)"), std::string::npos) << e;
  c = Json::parse(good.dump());
  c["r"] = Json(8);
  write_file_atomic(dir / "adapter_config.json", c.dump());
  e = error_of([&] { import_peft(dir.path(), s); });
  EXPECT_NE(e.find("rank 8"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::ckpt
