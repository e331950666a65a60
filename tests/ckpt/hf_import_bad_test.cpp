// Bad Hugging Face model directories: refused before anything is sized by the config, naming
// the file and the field or tensor.
#include <gtest/gtest.h>

#include "ckpt/hf_export.h"
#include "ckpt/hf_import_util.h"
#include "core/error.h"

namespace loom::ckpt {
namespace {

using testing::error_of;
using testing::ScratchDir;

void expect_error(const std::string& dir, std::initializer_list<std::string> needles) {
  const std::string e = error_of([&] { import_hf(dir); });
  ASSERT_FALSE(e.empty()) << "imported";
  for (const std::string& n : needles) EXPECT_NE(e.find(n), std::string::npos) << e;
}

TEST(HfImportBad, ALayerCountTheWeightsDoNotHoldIsAnErrorNotAnAllocation) {
  ScratchDir dir;
  const HfModelShape s = testing::tiny_llama3();
  export_hf(dir.path(), s, testing::random_params_of(s, 1));
  Json c = Json::parse(read_file(dir / "config.json"));
  c["num_hidden_layers"] = Json(1000000000);
  write_file_atomic(dir / "config.json", c.dump());
  expect_error(dir.path(), {"config.json", "num_hidden_layers = 1000000000", "2 layers"});
  c["num_hidden_layers"] = Json(3);
  write_file_atomic(dir / "config.json", c.dump());
  expect_error(dir.path(), {"num_hidden_layers = 3", "2 layers"});
  // A huge width is caught by the first tensor's shape, before any allocation.
  c["num_hidden_layers"] = Json(2);
  c["vocab_size"] = Json(2000000000);
  write_file_atomic(dir / "config.json", c.dump());
  expect_error(dir.path(), {"model.safetensors", "[13, 8]", "[2000000000, 8]"});
}

TEST(HfImportBad, UnsupportedRopeScalingAndBadFactorsNameTheField) {
  ScratchDir dir;
  const HfModelShape s = testing::tiny_llama3();
  export_hf(dir.path(), s, testing::random_params_of(s, 1));
  const Json good = Json::parse(read_file(dir / "config.json"));
  Json c = Json::parse(good.dump());
  c["rope_scaling"]["rope_type"] = Json("yarn");
  write_file_atomic(dir / "config.json", c.dump());
  expect_error(dir.path(), {"config.json", "rope_scaling type 'yarn'"});
  c = Json::parse(good.dump());
  c["rope_scaling"]["high_freq_factor"] = Json(0.5);
  write_file_atomic(dir / "config.json", c.dump());
  expect_error(dir.path(), {"rope_scaling", "low_freq_factor < high_freq_factor"});
  c = Json::parse(good.dump());
  c["rope_scaling"].as_object().erase("original_max_position_embeddings");
  write_file_atomic(dir / "config.json", c.dump());
  expect_error(dir.path(), {"original_max_position_embeddings"});
}

TEST(HfImportBad, BoolTensorsOtherThanKnownBuffersAreRefused) {
  ScratchDir dir;
  const HfModelShape s = testing::tiny_llama3();
  export_hf(dir.path(), s, testing::random_params_of(s, 1));
  TensorMap hf = loom_to_hf(s, testing::random_params_of(s, 1), DType::F32);
  testing::write_safetensors_with(dir / "model.safetensors", hf,
                                  {{"model.layers.0.gate_mask", "BOOL", {4}, "\1\0\1\0"}});
  expect_error(dir.path(), {"model.safetensors", "'model.layers.0.gate_mask'", "BOOL"});
  testing::write_safetensors_with(dir / "model.safetensors", hf,
                                  {{"model.layers.0.x", "C64", {1}, std::string(8, '\0')}});
  expect_error(dir.path(), {"'model.layers.0.x'", "unsupported dtype 'C64'"});
}

}  // namespace
}  // namespace loom::ckpt
