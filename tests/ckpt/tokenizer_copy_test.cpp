// A checkpoint's tokenizer: copied in at save (only a tokenizer's own files), found from any
// working directory; checkpoints without a copy resolve the run's relative data.tokenizer
// against the current directory, then the run directory and its ancestors.
#include "ckpt/tokenizer_copy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "temp_dir.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

// Runs the test body in `dir`, returning to the directory it started in.
struct InDir {
  fs::path before = fs::current_path();
  explicit InDir(const std::string& dir) { fs::current_path(dir); }
  ~InDir() { fs::current_path(before); }
};

}  // namespace

TEST(TokenizerCopy, CheckpointsServeFromAnyDirectory) {
  test::TempDir t("tokcopy");
  const std::string train = t / "train", other = t / "elsewhere";
  make_dirs(train + "/tok");
  make_dirs(other);
  write_file_atomic(train + "/tok/encoder.json", "{\"a\": 0}");
  write_file_atomic(train + "/tok/vocab.bpe", "#version: 0.2\n");
  write_file_atomic(train + "/tok/model.safetensors", "weights, never copied");
  const std::string cfg =
      "[data]\ntokenizer = \"gpt2:tok\"\nchat_template = \"llama3\"\n"
      "[train]\nout_dir = \"runs/main\"\n";
  const std::string step = train + "/runs/main/checkpoints/step_00000004";
  const std::string copy = train + "/runs/main/checkpoints/tokenizer";
  {
    InDir in(train);  // as the trainer runs: the spec is relative to here
    ckpt::copy_tokenizer_in("runs/main", cfg);
  }
  EXPECT_EQ(read_file(copy + "/encoder.json"), "{\"a\": 0}");
  EXPECT_EQ(read_file(copy + "/vocab.bpe"), "#version: 0.2\n");
  EXPECT_FALSE(fs::exists(copy + "/model.safetensors"));
  {
    InDir in(other);
    const std::string spec = ckpt::checkpoint_tokenizer_spec(step, cfg);
    EXPECT_EQ(spec, "gpt2:" + fs::path(copy + "/.").lexically_normal().string());
    EXPECT_TRUE(fs::is_regular_file(spec.substr(5) + "/encoder.json"));
    EXPECT_EQ(ckpt::checkpoint_chat_template(step), "llama3");
    EXPECT_EQ(ckpt::checkpoint_chat_template(train + "/runs/main/checkpoints"), "llama3");
  }
  // The source changes its name: the copy is replaced; the same spec again leaves it be.
  write_file_atomic(train + "/tok2", "ranks");
  {
    InDir in(train);
    ckpt::copy_tokenizer_in("runs/main", "[data]\ntokenizer = \"tiktoken:tok2\"\n");
  }
  EXPECT_FALSE(fs::exists(copy + "/encoder.json"));
  EXPECT_EQ(read_file(copy + "/tok2"), "ranks");
  EXPECT_EQ(ckpt::checkpoint_tokenizer_spec(step, ""), "tiktoken:" + copy + "/tok2");
}

TEST(TokenizerCopy, CheckpointsWithoutACopyResolveTheRunsPath) {
  test::TempDir t("tokold");
  const std::string train = t / "train", other = t / "elsewhere";
  make_dirs(train + "/tok");
  make_dirs(other);
  write_file_atomic(train + "/tok/encoder.json", "{}");
  const std::string cfg = "[data]\ntokenizer = \"gpt2:tok\"\n";
  const std::string step = train + "/runs/main/checkpoints/step_00000004";
  {
    InDir in(train);  // where training ran: the recorded path as it is
    EXPECT_EQ(ckpt::checkpoint_tokenizer_spec(step, cfg), "gpt2:tok");
  }
  InDir in(other);  // elsewhere: found above the run directory
  EXPECT_EQ(ckpt::checkpoint_tokenizer_spec(step, cfg), "gpt2:" + train + "/tok");
  // A per-rank root one level deeper resolves the same way.
  EXPECT_EQ(
      ckpt::checkpoint_tokenizer_spec(train + "/runs/main/checkpoints/rank_00000/step_1", cfg),
      "gpt2:" + train + "/tok");
  // Absent everywhere: the recorded spec, for the loader's error to name; none: byte-level.
  EXPECT_EQ(ckpt::checkpoint_tokenizer_spec(step, "[data]\ntokenizer = \"gpt2:gone\"\n"),
            "gpt2:gone");
  EXPECT_EQ(ckpt::checkpoint_tokenizer_spec(step, ""), "");
  EXPECT_THROW(ckpt::copy_tokenizer_in(t / "run", "[data]\ntokenizer = \"gpt2:gone\"\n"), Error);
}
