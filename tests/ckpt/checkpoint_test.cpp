#include "ckpt/checkpoint.h"

#include <gtest/gtest.h>

#include <tuple>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "ckpt/test_util.h"
#include "core/error.h"

namespace loom::ckpt {
namespace {

using testing::error_of;
using testing::random_tensor;
using testing::same_tensor;
using testing::ScratchDir;
namespace fs = std::filesystem;

TensorMap model_tensors(uint32_t seed) {
  return {{"embed.wte", random_tensor({11, 8}, DType::F32, seed)},
          {"blocks.0.attn.qkv.weight", random_tensor({24, 8}, DType::F32, seed + 1)},
          {"final_norm.weight", random_tensor({8}, DType::F32, seed + 2)}};
}
TensorMap optim_tensors(uint32_t seed) {
  return {{"adam.m", random_tensor({123}, DType::F32, seed + 10)},
          {"adam.v", random_tensor({123}, DType::F32, seed + 11)},
          {"step_count", random_tensor({1}, DType::I64, seed + 12)}};
}
TrainerState state_for(int64_t step) {
  TrainerState s;
  s.step = step;
  s.seed = 0xfedcba9876543210ull;  // above INT64_MAX: must survive the JSON round trip
  s.rng["dropout_offset"] = Json(int64_t{step * 1000});
  s.data["sample"] = Json(int64_t{step * 32});
  s.data["epoch"] = Json(2);
  s.config_text = "[model]\npreset = \"tiny\"\n";
  s.extra["loss_scale"] = Json(1024.0);
  return s;
}
// Zeroed tensors of the same names/shapes/dtypes, to restore into.
TensorMap zeros_like(const TensorMap& m) {
  TensorMap out;
  for (const auto& [n, t] : m) out[n] = Tensor::zeros(t.shape(), t.dtype());
  return out;
}
std::vector<std::string> dir_names(const std::string& root) {
  std::vector<std::string> names;
  for (const auto& de : fs::directory_iterator(root)) names.push_back(de.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Checkpoint, SaveThenLoadRestoresEverything) {
  ScratchDir root;
  const TensorMap model = model_tensors(1), optim = optim_tensors(1);
  const std::string dir = save_checkpoint(root.path(), state_for(42), model, optim);
  EXPECT_EQ(dir, root / "step_00000042");
  EXPECT_EQ(read_file(root / "latest"), "step_00000042\n");
  EXPECT_EQ(dir_names(root.path()), (std::vector<std::string>{"latest", "step_00000042"}));
  EXPECT_EQ(dir_names(dir), (std::vector<std::string>{"commit.json", "model.safetensors",
                                                      "optim.safetensors", "state.json"}));

  Checkpoint ck(root.path());  // through `latest`
  EXPECT_EQ(ck.dir(), dir);
  const TrainerState& s = ck.state();
  const TrainerState want = state_for(42);
  EXPECT_EQ(s.step, 42);
  EXPECT_EQ(s.seed, want.seed);
  EXPECT_EQ(s.rng.dump(), want.rng.dump());
  EXPECT_EQ(s.data.dump(), want.data.dump());
  EXPECT_EQ(s.config_text, want.config_text);
  EXPECT_EQ(s.extra.dump(), want.extra.dump());
  EXPECT_EQ(s.fingerprint, shape_fingerprint(model)) << "empty fingerprint defaults to shapes";

  TensorMap m2 = zeros_like(model), o2 = zeros_like(optim);
  ck.restore_model(m2, shape_fingerprint(model));
  ck.restore_optim(o2);
  for (const auto& [n, t] : model) EXPECT_TRUE(same_tensor(m2.at(n), t)) << n;
  for (const auto& [n, t] : optim) EXPECT_TRUE(same_tensor(o2.at(n), t)) << n;
}

TEST(Checkpoint, RestoresIntoViewsOfOneBuffer) {
  // The model keeps all parameters in one allocation; restore must write through the views.
  ScratchDir root;
  const TensorMap model = model_tensors(3);
  save_checkpoint(root.path(), state_for(1), model, TensorMap{});
  Tensor flat = Tensor::zeros({11 * 8 + 24 * 8 + 8});
  TensorMap views = {{"embed.wte", flat.slice(0, 88).reshape({11, 8})},
                     {"blocks.0.attn.qkv.weight", flat.slice(88, 88 + 192).reshape({24, 8})},
                     {"final_norm.weight", flat.slice(280, 288)}};
  Checkpoint(root / "step_00000001").restore_model(views);
  EXPECT_EQ(flat.data<float>()[0], model.at("embed.wte").data<float>()[0]);
  EXPECT_EQ(flat.data<float>()[287], model.at("final_norm.weight").data<float>()[7]);
  EXPECT_EQ(flat.data<float>()[88 + 5], model.at("blocks.0.attn.qkv.weight").data<float>()[5]);
}

TEST(Checkpoint, KeepLastDeletesOlderStepsOnly) {
  ScratchDir root;
  for (int64_t step : {10, 20, 30, 40, 50})
    save_checkpoint(root.path(), state_for(step), model_tensors(step), optim_tensors(step), 2);
  EXPECT_EQ(list_checkpoint_steps(root.path()), (std::vector<int64_t>{40, 50}));
  EXPECT_EQ(*find_latest_checkpoint(root.path()), root / "step_00000050");
  // A rollback: resaving an earlier step keeps the newer "future" directories untouched.
  save_checkpoint(root.path(), state_for(45), model_tensors(45), optim_tensors(45), 1);
  EXPECT_EQ(list_checkpoint_steps(root.path()), (std::vector<int64_t>{45, 50}));
  EXPECT_EQ(Checkpoint(root.path()).state().step, 45);
  // keep_last = 0 keeps everything.
  save_checkpoint(root.path(), state_for(60), model_tensors(60), optim_tensors(60), 0);
  EXPECT_EQ(list_checkpoint_steps(root.path()), (std::vector<int64_t>{45, 50, 60}));
}

TEST(Checkpoint, ResavingAStepReplacesIt) {
  ScratchDir root;
  save_checkpoint(root.path(), state_for(7), model_tensors(1), optim_tensors(1));
  const TensorMap newer = model_tensors(100);
  save_checkpoint(root.path(), state_for(7), newer, optim_tensors(100));
  Checkpoint ck(root.path());
  TensorMap m = zeros_like(newer);
  ck.restore_model(m);
  for (const auto& [n, t] : newer) EXPECT_TRUE(same_tensor(m.at(n), t)) << n;
  EXPECT_EQ(dir_names(root.path()), (std::vector<std::string>{"latest", "step_00000007"}));
}

TEST(Checkpoint, ShardInfoRoundTripsAndIsChecked) {
  ScratchDir root;
  TensorList model = {
      {"w", random_tensor({2, 8}, DType::F32, 1), {{6, 8}, {2, 0}, 0}},
      {"b", random_tensor({8}, DType::F32, 2), {{}, {}, 1}},
  };
  save_checkpoint(root.path(), state_for(3), model, TensorList{});
  Checkpoint ck(root.path());
  EXPECT_EQ(ck.model().entry("w").shard, model[0].shard);
  EXPECT_EQ(ck.model().entry("b").shard.replica_id, 1);
  // Fingerprint uses global shapes: the same as an unsharded model with the full tensors.
  EXPECT_EQ(ck.state().fingerprint,
            shape_fingerprint(TensorMap{{"w", Tensor::zeros({6, 8})}, {"b", Tensor::zeros({8})}}));

  TensorList dst = {{"w", Tensor::zeros({2, 8}), {{6, 8}, {2, 0}, 0}},
                    {"b", Tensor::zeros({8}), {}}};
  ck.restore_model(dst);
  EXPECT_TRUE(same_tensor(dst[0].tensor, model[0].tensor));
  TensorList elsewhere = {{"w", Tensor::zeros({2, 8}), {{6, 8}, {4, 0}, 0}},
                          {"b", Tensor::zeros({8}), {}}};
  std::string e = error_of([&] { ck.restore_model(elsewhere); });
  EXPECT_NE(e.find("'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 0]"), std::string::npos) << e;
  EXPECT_NE(e.find("[4, 0]"), std::string::npos) << e;
}

TEST(Checkpoint, MismatchedModelNamesFirstDifferingTensorAndBothShapes) {
  ScratchDir root;
  const TensorMap model = model_tensors(1);
  save_checkpoint(root.path(), state_for(5), model, optim_tensors(1));
  Checkpoint ck(root.path());

  TensorMap wrong_shape = zeros_like(model);
  wrong_shape["blocks.0.attn.qkv.weight"] = Tensor::zeros({48, 8});
  wrong_shape["final_norm.weight"] = Tensor::zeros({9});  // later in name order
  Tensor before = wrong_shape["embed.wte"];
  std::string e = error_of([&] { ck.restore_model(wrong_shape); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("'blocks.0.attn.qkv.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[24, 8]"), std::string::npos) << e;
  EXPECT_NE(e.find("[48, 8]"), std::string::npos) << e;
  for (int i = 0; i < 88; ++i) ASSERT_EQ(before.data<float>()[i], 0.f) << "nothing written";

  TensorMap missing = zeros_like(model);
  missing["blocks.0.attn.extra"] = Tensor::zeros({3});
  e = error_of([&] { ck.restore_model(missing); });
  EXPECT_NE(e.find("'blocks.0.attn.extra'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing from the checkpoint"), std::string::npos) << e;

  TensorMap fewer = zeros_like(model);
  fewer.erase("final_norm.weight");
  e = error_of([&] { ck.restore_model(fewer); });
  EXPECT_NE(e.find("'final_norm.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("not in the model"), std::string::npos) << e;

  TensorMap wrong_dtype = zeros_like(model);
  wrong_dtype["embed.wte"] = Tensor::zeros({11, 8}, DType::BF16);
  e = error_of([&] { ck.restore_model(wrong_dtype); });
  EXPECT_NE(e.find("'embed.wte'"), std::string::npos) << e;
  EXPECT_NE(e.find("bf16"), std::string::npos) << e;

  e = error_of([&] { ck.restore_model(zeros_like(model), "gpt2 layers=12"); });
  EXPECT_NE(e.find("state.json"), std::string::npos) << e;
  EXPECT_NE(e.find("fingerprint"), std::string::npos) << e;

  TensorMap optim_wrong = zeros_like(optim_tensors(1));
  optim_wrong["adam.v"] = Tensor::zeros({124});
  e = error_of([&] { ck.restore_optim(optim_wrong); });
  EXPECT_NE(e.find("optim.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("'adam.v'"), std::string::npos) << e;
}

TEST(Checkpoint, DamagedCheckpointsGiveErrorsNamingTheFile) {
  ScratchDir root;
  const std::string dir =
      save_checkpoint(root.path(), state_for(9), model_tensors(1), optim_tensors(1));
  const std::string model_path = dir + "/model.safetensors";
  const std::string state_path = dir + "/state.json";
  const std::string model_bytes = read_file(model_path), state_bytes = read_file(state_path);

  write_file_atomic(model_path, model_bytes.substr(0, model_bytes.size() - 3));
  std::string e = error_of([&] { Checkpoint ck(root.path()); });
  EXPECT_NE(e.find(model_path), std::string::npos) << e;
  write_file_atomic(model_path, model_bytes);

  fs::remove(dir + "/optim.safetensors");
  e = error_of([&] { Checkpoint ck(dir); });
  EXPECT_NE(e.find("optim.safetensors"), std::string::npos) << e;

  write_file_atomic(state_path, "{\"format\": \"loom.checkpoint\",");
  e = error_of([&] { Checkpoint ck(dir); });
  EXPECT_NE(e.find(state_path), std::string::npos) << e;

  write_file_atomic(state_path, "{\"format\": \"loom.checkpoint\", \"version\": 1}");
  e = error_of([&] { Checkpoint ck(dir); });
  EXPECT_NE(e.find(state_path), std::string::npos) << e;
  EXPECT_NE(e.find("'step'"), std::string::npos) << e;

  // A version-1 state.json (no commit record to catch it) with a field of the wrong type: the
  // error names the file and the field.
  for (const auto& [from, to, field] :
       {std::tuple{"\"step\": 9", "\"step\": \"9\"", "field 'step': expected integer"},
        std::tuple{"\"extra\": {", "\"extra\": {\"optimizer_steps\": \"1\", ",
                   "field 'extra.optimizer_steps': expected integer"},
        std::tuple{"\"data\": {", "\"data\": 3, \"unused\": {",
                   "field 'data': expected an object"}}) {
    std::string text = state_bytes;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << text;
    text.replace(at, std::string(from).size(), to);
    const size_t v = text.find("\"version\": 2");
    ASSERT_NE(v, std::string::npos) << text;
    text.replace(v, 12, "\"version\": 1");
    write_file_atomic(state_path, text);
    fs::remove(dir + "/commit.json");
    e = error_of([&] { Checkpoint ck(dir); });
    EXPECT_NE(e.find(state_path), std::string::npos) << e;
    EXPECT_NE(e.find(field), std::string::npos) << e;
  }

  fs::remove(state_path);
  e = error_of([&] { Checkpoint ck(dir); });
  EXPECT_NE(e.find(state_path), std::string::npos) << e;

  write_file_atomic(root / "latest", "step_00000077\n");
  e = error_of([&] { Checkpoint ck(root.path()); });
  EXPECT_NE(e.find("latest"), std::string::npos) << e;
  EXPECT_NE(e.find("step_00000077"), std::string::npos) << e;

  write_file_atomic(root / "latest", "../../etc\n");
  e = error_of([&] { find_latest_checkpoint(root.path()); });
  EXPECT_NE(e.find("latest"), std::string::npos) << e;
}

TEST(Checkpoint, FreshRootHasNoLatest) {
  ScratchDir root;
  EXPECT_FALSE(find_latest_checkpoint(root.path()).has_value());
  EXPECT_FALSE(find_latest_checkpoint(root / "does_not_exist").has_value());
  EXPECT_TRUE(list_checkpoint_steps(root / "does_not_exist").empty());
  std::string e = error_of([&] { Checkpoint ck(root.path()); });
  EXPECT_NE(e.find(root.path()), std::string::npos) << e;
  EXPECT_NE(e.find("no checkpoint"), std::string::npos) << e;
}

TEST(Checkpoint, LeftoversOfACrashedSaveAreIgnoredThenRemoved) {
  ScratchDir root;
  save_checkpoint(root.path(), state_for(1), model_tensors(1), optim_tensors(1));
  // A process that died mid-save left a partial directory under its pid.
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  const std::string partial = root / cat("step_00000002.tmp.", child);
  make_dirs(partial);
  write_file_atomic(partial + "/model.safetensors", "garbage");
  // Such a directory is not a checkpoint.
  EXPECT_EQ(list_checkpoint_steps(root.path()), (std::vector<int64_t>{1}));
  EXPECT_EQ(Checkpoint(root.path()).state().step, 1);
  save_checkpoint(root.path(), state_for(3), model_tensors(3), optim_tensors(3));
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_EQ(list_checkpoint_steps(root.path()), (std::vector<int64_t>{1, 3}));
}

TEST(Checkpoint, FailedSaveLeavesThePreviousCheckpointCurrent) {
  ScratchDir root;
  save_checkpoint(root.path(), state_for(1), model_tensors(1), optim_tensors(1));
  TensorMap bad = model_tensors(2);
  bad["undefined"] = Tensor();
  EXPECT_THROW(save_checkpoint(root.path(), state_for(2), bad, optim_tensors(2), 1), Error);
  EXPECT_EQ(dir_names(root.path()), (std::vector<std::string>{"latest", "step_00000001"}));
  EXPECT_EQ(Checkpoint(root.path()).state().step, 1);
}

TEST(Checkpoint, StepDirNames) {
  EXPECT_EQ(step_dir_name(0), "step_00000000");
  EXPECT_EQ(step_dir_name(123456789), "step_123456789");
  int64_t s = -1;
  EXPECT_TRUE(parse_step_dir_name("step_00000042", &s));
  EXPECT_EQ(s, 42);
  EXPECT_TRUE(parse_step_dir_name("step_123456789", &s));
  EXPECT_EQ(s, 123456789);
  EXPECT_FALSE(parse_step_dir_name("step_42", &s));
  EXPECT_FALSE(parse_step_dir_name("step_00000042.tmp.12", &s));
  EXPECT_FALSE(parse_step_dir_name("step_0000004x", &s));
  EXPECT_FALSE(parse_step_dir_name("latest", &s));
  EXPECT_FALSE(parse_step_dir_name("step_9999999999999999999", &s));  // would overflow
}

TEST(Checkpoint, FingerprintDependsOnNamesAndShapesOnly) {
  TensorMap a = {{"x", Tensor::zeros({2, 3})}, {"y", Tensor::zeros({4})}};
  TensorMap b = {{"x", Tensor::zeros({2, 3}, DType::BF16)}, {"y", Tensor::zeros({4})}};
  TensorMap c = {{"x", Tensor::zeros({3, 2})}, {"y", Tensor::zeros({4})}};
  TensorMap d = {{"x", Tensor::zeros({2, 3})}, {"z", Tensor::zeros({4})}};
  EXPECT_EQ(shape_fingerprint(a), shape_fingerprint(b));
  EXPECT_NE(shape_fingerprint(a), shape_fingerprint(c));
  EXPECT_NE(shape_fingerprint(a), shape_fingerprint(d));
}

}  // namespace
}  // namespace loom::ckpt
