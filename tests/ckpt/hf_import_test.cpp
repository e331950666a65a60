// Hugging Face import/export completeness: Llama 3.1's rope_scaling, bos/eos ids and
// generation_config.json, BOOL buffers read past.
#include <gtest/gtest.h>

#include "ckpt/hf_export.h"
#include "ckpt/hf_import_util.h"
#include "core/error.h"

namespace loom::ckpt {
namespace {

using testing::same_tensor;
using testing::ScratchDir;

TEST(HfImport, Llama3RopeScalingRoundTripsThroughConfigJson) {
  const HfModelShape s = testing::tiny_llama3();
  const Json c = hf_config_json(s, DType::F32);
  const Json& r = c.at("rope_scaling");
  EXPECT_EQ(r.at("rope_type").as_string(), "llama3");
  EXPECT_EQ(r.at("factor").as_double(), 8.0);
  EXPECT_EQ(r.at("original_max_position_embeddings").as_int(), 16);
  EXPECT_EQ(c.at("bos_token_id").as_int(), 11);
  EXPECT_EQ(c.at("eos_token_id").as_int(), 12);
  const HfModelShape back = hf_shape_from_config(Json::parse(c.dump()), "config.json");
  EXPECT_EQ(back, s);
  // The older spelling ("type") and Llama 3.1's own numbers.
  Json older = Json::parse(c.dump());
  older["rope_scaling"] = Json::parse(
      R"({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192})");
  const HfModelShape o = hf_shape_from_config(older, "config.json");
  EXPECT_EQ(o.rope_scaling, (RopeScaling{8.f, 1.f, 4.f, 8192}));
  older["rope_scaling"] = Json::parse(R"({"rope_type": "default"})");
  EXPECT_FALSE(hf_shape_from_config(older, "config.json").rope_scaling.enabled());
}

TEST(HfImport, ExportWritesGenerationConfigWithTheIds) {
  ScratchDir dir;
  const HfModelShape s = testing::tiny_llama3();
  export_hf(dir.path(), s, testing::random_params_of(s, 3), DType::F32, 0, {12, 10});
  const Json g = Json::parse(read_file(dir / "generation_config.json"));
  EXPECT_EQ(g.at("bos_token_id").as_int(), 11);
  ASSERT_TRUE(g.at("eos_token_id").is_array());
  EXPECT_EQ(g.at("eos_token_id").as_array()[1].as_int(), 10);
  const HfModel m = import_hf(dir.path());
  EXPECT_EQ(m.shape.bos_token_id, 11);
  EXPECT_EQ(m.shape.eos_token_id, 12);
  // Without ids the file goes: an earlier export's ids would describe another model.
  HfModelShape plain = s;
  plain.bos_token_id = plain.eos_token_id = -1;
  export_hf(dir.path(), plain, testing::random_params_of(s, 3));
  EXPECT_FALSE(file_exists(dir / "generation_config.json"));
}

TEST(HfImport, BoolMaskBuffersAreReadPast) {
  ScratchDir dir;
  HfModelShape s = testing::tiny_llama3();
  s.family = "gpt2";
  s.n_kv_head = s.n_head = 2;
  s.head_dim = 4;
  s.tied = true;
  s.rope_scaling = {};
  const TensorMap p = testing::random_params_of(s, 5);
  TensorMap hub;
  for (auto& [n, t] : loom_to_hf(s, p, DType::F32))
    hub[n.substr(std::string("transformer.").size())] = t;
  const std::string mask(64 * 64, '\1');
  testing::write_safetensors_with(dir / "model.safetensors", hub,
                                  {{"h.0.attn.bias", "BOOL", {1, 1, 64, 64}, mask},
                                   {"h.1.attn.bias", "BOOL", {1, 1, 64, 64}, mask}});
  write_file_atomic(dir / "config.json", hf_config_json(s, DType::F32).dump(2));
  const HfModel m = import_hf(dir.path());
  for (const auto& [n, t] : p) EXPECT_TRUE(same_tensor(m.params.at(n), t)) << n;
}

}  // namespace
}  // namespace loom::ckpt
