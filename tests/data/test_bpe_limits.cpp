// Tokenizer files whose ids would size memory beyond the file: found by fuzzing (tests/fuzz,
// corpus tiktoken/regress-* and tokenizer_gpt2/regress-*). Each must be a loom::Error naming
// the file, never an allocation of gigabytes or a std::length_error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "data/bpe.h"

using namespace loom;
using namespace loom::data;

namespace {

// A folder removed when the test ends, pass or fail.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("loom_bpe_limits_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    std::string p = (path / name).string();
    write_file_atomic(p, text);
    return p;
  }
};

void expect_error_naming(const std::function<void()>& load, const std::string& file,
                         const std::string& what) {
  try {
    load();
    FAIL() << "expected an error naming " << file;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(BpeLimits, TiktokenHugeRankIsAnErrorNotAnAllocation) {
  ScratchDir dir("tiktoken");
  // Two lines claiming ranks 0 and 999999999: the old reader sized a vector of a billion strings.
  std::string path = dir.file("v.tiktoken", "QQ== 0\nQg== 999999999\n");
  expect_error_naming([&] { load_tiktoken(path, PreTokenizer::Gpt2, {}); }, path,
                      "id 999999999 is too large for 2 tokens");
}

std::string base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    if (i + 2 < in.size()) v |= uint8_t(in[i + 2]);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? k[v & 63] : '=';
  }
  return out;
}

TEST(BpeLimits, TiktokenHolesBelowTheBoundStillLoad) {
  ScratchDir dir("tiktoken_holes");
  // The 256 bytes at ranks 0..255, then "AB" at rank 1000: holes (special tokens' slots) load.
  std::string text;
  for (int b = 0; b < 256; ++b)
    text += base64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  text += base64("AB") + " 1000\n";
  BpeTokenizer tok = load_tiktoken(dir.file("v.tiktoken", text), PreTokenizer::Gpt2, {});
  EXPECT_EQ(tok.encode("AB"), std::vector<int32_t>{1000});
  EXPECT_EQ(tok.encode("A"), std::vector<int32_t>{'A'});
}

TEST(BpeLimits, Gpt2EncoderHugeIdIsAnError) {
  ScratchDir dir("gpt2");
  // The old reader called resize(id + 1) with id near 2^62: std::length_error, not loom::Error.
  std::string enc = dir.file("encoder.json", R"({"A": 0, "B": 4611686018427387904})");
  dir.file("vocab.bpe", "#version: 0.2\n");
  expect_error_naming([&] { load_gpt2_tokenizer(dir.path.string()); }, enc,
                      "id 4611686018427387904 is too large for 2 tokens");
}

}  // namespace
