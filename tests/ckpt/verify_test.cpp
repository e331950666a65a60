// Verified checkpoints: XXH64 against known values, the commit record's checksums catching flipped
// bytes, truncation, missing and altered files, and a root falling back to the newest checkpoint
// that verifies.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/checksum.h"
#include "ckpt/test_util.h"
#include "core/error.h"
#include "core/fs.h"

namespace loom::ckpt {
namespace {

using testing::error_of;
using testing::flip_data_bytes;
using testing::random_tensor;
using testing::same_tensor;
using testing::ScratchDir;
namespace fs = std::filesystem;

TensorMap model_tensors(uint32_t seed) {
  return {{"embed.wte", random_tensor({64, 16}, DType::F32, seed)},
          {"blocks.0.mlp.fc.weight", random_tensor({32, 16}, DType::BF16, seed + 1)},
          {"final_norm.weight", random_tensor({16}, DType::F32, seed + 2)}};
}
TensorMap optim_tensors(uint32_t seed) {
  return {{"adam.m", random_tensor({1024}, DType::F32, seed + 10)},
          {"adam.v", random_tensor({1024}, DType::F32, seed + 11)}};
}
TrainerState state_for(int64_t step) {
  TrainerState s;
  s.step = step;
  s.data["sample"] = Json(step * 8);
  return s;
}
std::string save_step(const std::string& root, int64_t step) {
  return save_checkpoint(root, state_for(step), model_tensors(uint32_t(step)),
                         optim_tensors(uint32_t(step)));
}

TEST(Checksum, Xxh64MatchesTheReferenceAlgorithm) {
  // Full values of the reference implementation for short inputs.
  EXPECT_EQ(xxh64("", 0), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(xxh64("a", 1), 0xD24EC4F1A98C6E5Bull);
  EXPECT_EQ(xxh64("abc", 3), 0x44BC2CF5AD770999ull);
  // Longer inputs take the 32-byte stripe path: the low 32 bits are the content checksum that
  // `zstd --check` stores (computed with zstd 1.5.4's CLI).
  std::string xs(1000, 'x');
  EXPECT_EQ(xxh64(xs.data(), xs.size()) & 0xffffffffu, 0x9cb700e1u);
  std::string seq;
  for (int i = 1; i <= 300; ++i) seq += std::to_string(i) + "\n";
  EXPECT_EQ(xxh64(seq.data(), seq.size()) & 0xffffffffu, 0xb1965e35u);
  EXPECT_NE(xxh64("abc", 3, 1), xxh64("abc", 3));  // the seed matters
  uint64_t v = 0;
  EXPECT_TRUE(parse_hex64(hex64(0x0123456789abcdefull), &v));
  EXPECT_EQ(v, 0x0123456789abcdefull);
  EXPECT_FALSE(parse_hex64("0123456789ABCDEF", &v));  // written lowercase only
  EXPECT_FALSE(parse_hex64("123", &v));
}

TEST(VerifiedCheckpoint, FlippedBytesInEitherTensorFileAreDetectedAndFallenBackFrom) {
  for (const char* file : {"model.safetensors", "optim.safetensors"}) {
    ScratchDir root;
    save_step(root.path(), 1);
    const std::string bad = save_step(root.path(), 2);
    flip_data_bytes(bad + "/" + file, 64, 7);
    // The step directory itself is refused, naming the file and a tensor.
    std::string e = error_of([&] { Checkpoint c(bad); });
    EXPECT_NE(e.find(bad + "/" + file), std::string::npos) << e;
    EXPECT_NE(e.find("checksum"), std::string::npos) << e;
    EXPECT_NE(e.find("tensor '"), std::string::npos) << e;
    EXPECT_THROW(verify_checkpoint(bad), CheckpointCorrupt);
    // The root falls back to step 1, whose tensors come back intact.
    Checkpoint c(root.path());
    EXPECT_EQ(c.state().step, 1) << file;
    TensorMap m;
    for (const auto& [n, t] : model_tensors(1)) m[n] = Tensor::zeros(t.shape(), t.dtype());
    c.restore_model(m);
    for (const auto& [n, t] : model_tensors(1)) EXPECT_TRUE(same_tensor(m.at(n), t)) << n;
  }
}

TEST(VerifiedCheckpoint, TruncatedMissingOrAlteredLatestFallsBackToThePreviousOne) {
  ScratchDir root;
  save_step(root.path(), 1);
  const std::string dir = save_step(root.path(), 2);
  const std::string model = dir + "/model.safetensors", state = dir + "/state.json";
  const std::string model_bytes = read_file(model), state_bytes = read_file(state);

  fs::resize_file(model, model_bytes.size() - 100);  // cut inside the last tensor
  EXPECT_EQ(Checkpoint(root.path()).state().step, 1);
  EXPECT_NE(error_of([&] { Checkpoint c(dir); }).find(model), std::string::npos);
  write_file_atomic(model, model_bytes);
  EXPECT_EQ(Checkpoint(root.path()).state().step, 2);

  fs::remove(dir + "/optim.safetensors");
  EXPECT_EQ(Checkpoint(root.path()).state().step, 1);
  save_step(root.path(), 2);  // re-saved: whole again

  // A changed data position is as bad as a changed weight: state.json is checksummed too.
  std::string altered = read_file(state);
  const size_t at = altered.find("\"sample\": 16");
  ASSERT_NE(at, std::string::npos) << altered;
  altered[at + 11] = '7';
  write_file_atomic(state, altered);
  std::string e = error_of([&] { Checkpoint c(dir); });
  EXPECT_NE(e.find(state), std::string::npos) << e;
  EXPECT_EQ(Checkpoint(root.path()).state().step, 1);
  write_file_atomic(state, state_bytes);

  fs::remove(dir + "/commit.json");  // a version-2 checkpoint without its commit record
  e = error_of([&] { Checkpoint c(dir); });
  EXPECT_NE(e.find("commit.json: missing"), std::string::npos) << e;
  EXPECT_EQ(Checkpoint(root.path()).state().step, 1);
}

TEST(VerifiedCheckpoint, NothingVerifiesIsAnErrorListingEveryStep) {
  ScratchDir root;
  const std::string d1 = save_step(root.path(), 1), d2 = save_step(root.path(), 2);
  flip_data_bytes(d1 + "/optim.safetensors", 64, 1);
  flip_data_bytes(d2 + "/model.safetensors", 64, 2);
  try {
    Checkpoint c(root.path());
    ADD_FAILURE() << "a corrupt checkpoint was opened";
  } catch (const CheckpointCorrupt& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no checkpoint here verifies"), std::string::npos) << m;
    EXPECT_NE(m.find("step 2: " + d2 + "/model.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("step 1: " + d1 + "/optim.safetensors"), std::string::npos) << m;
  }
}

TEST(VerifiedCheckpoint, StepsAfterLatestAreNotFallenBackTo) {
  // Step 3 is an abandoned future (latest says 2, as after a rollback): it is never chosen.
  ScratchDir root;
  save_step(root.path(), 1);
  save_step(root.path(), 3);
  const std::string d2 = save_step(root.path(), 2);
  flip_data_bytes(d2 + "/model.safetensors", 64, 3);
  EXPECT_EQ(Checkpoint(root.path()).state().step, 1);
  // A damaged `latest` leaves the directories to go by: the newest that verifies.
  write_file_atomic(root / "latest", "garbage\n");
  EXPECT_EQ(Checkpoint(root.path()).state().step, 3);
}

TEST(VerifiedCheckpoint, LegacyCheckpointsWithoutCommitRecordLoadUnverified) {
  ScratchDir root;
  const std::string dir = save_step(root.path(), 4);
  fs::remove(dir + "/commit.json");
  std::string state = read_file(dir + "/state.json");
  const size_t at = state.find("\"version\": 2");
  ASSERT_NE(at, std::string::npos) << state;
  state.replace(at, 12, "\"version\": 1");
  write_file_atomic(dir + "/state.json", state);
  EXPECT_EQ(Checkpoint(dir).state().step, 4);
  EXPECT_NO_THROW(verify_checkpoint(dir));
}

TEST(VerifiedCheckpoint, CommitDigestChangesWithTheContents) {
  ScratchDir a, b;
  const std::string da = save_step(a.path(), 5), db = save_step(b.path(), 5);
  EXPECT_EQ(commit_digest(da), commit_digest(db));  // deterministic bytes, same record
  save_checkpoint(b.path(), state_for(5), model_tensors(6), optim_tensors(5));
  EXPECT_NE(commit_digest(da), commit_digest(db));
  fs::remove(db + "/commit.json");
  EXPECT_THROW(commit_digest(db), CheckpointCorrupt);
  EXPECT_NE(error_of([&] { verify_checkpoint(a.path()); }).find("not a checkpoint step"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::ckpt
