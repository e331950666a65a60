// Chat token files, bad input: malformed JSONL names its file and line and writes nothing; a
// missing, short or corrupt loss-mask file, and ids past the vocabulary, are errors naming the
// file and the sequence.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/fs.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "data/chat_tokens.h"
#include "temp_dir.h"
#include "train/chat_source.h"

using namespace loom;

namespace {

// Runs f, which must throw an Error whose message holds every needle.
template <typename F>
void expect_error(F&& f, std::vector<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

const std::string kGood =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
    "\"content\": \"yo\"}]}\n";

// Writes an indexed dataset of the given sequences.
void write_dataset(const std::string& prefix, data::TokenDType dtype,
                   const std::vector<std::vector<int32_t>>& seqs) {
  data::IndexedDatasetWriter w(prefix, dtype);
  for (const auto& s : seqs) w.add_document(s);
  w.finalize();
}

}  // namespace

TEST(ChatTokensBad, MalformedLineNamesFileAndLineAndWritesNothing) {
  const std::string d = loom::test::scoped_dir("chat_tokens_bad_line");
  write_file_atomic(d + "/c.jsonl", kGood + kGood + "{\"messages\": [{\"role\": \"wizard\"}]}\n");
  auto tok = data::byte_chatml_tokenizer();
  data::ChatTemplate t("chatml", tok);
  expect_error([&] { data::write_chat_token_files({d + "/c.jsonl"}, t, 259, d + "/out"); },
               {d + "/c.jsonl:3"});
  for (const char* f : {"/out.bin", "/out.idx", "/out.mask.bin", "/out.mask.idx"})
    EXPECT_FALSE(file_exists(d + f)) << f;
  write_file_atomic(d + "/empty.jsonl", "\n\n");
  expect_error([&] { data::write_chat_token_files({d + "/empty.jsonl"}, t, 259, d + "/out"); },
               {"no examples", "empty.jsonl"});
}

// `loom tokenize --chat` refuses content that is not UTF-8, as plain `loom tokenize` does, naming
// the line, the message and the byte, and writes nothing.
TEST(ChatTokensBad, InvalidUtf8ContentIsRefused) {
  const std::string d = loom::test::scoped_dir("chat_tokens_bad_utf8");
  for (const std::string& bad :
       {std::string("{\"messages\": [{\"role\": \"user\", \"content\": \"h\xff\"}, "
                    "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n"),
        std::string("{\"prompt\": \"hi\", \"completion\": \"\xc3\x28\"}\n")}) {
    write_file_atomic(d + "/c.jsonl", kGood + bad);
    auto tok = data::byte_chatml_tokenizer();
    data::ChatTemplate t("chatml", tok);
    expect_error([&] { data::write_chat_token_files({d + "/c.jsonl"}, t, 259, d + "/out"); },
                 {d + "/c.jsonl:2", "is not valid UTF-8 (byte "});
    EXPECT_FALSE(file_exists(d + "/out.bin"));
  }
}

TEST(ChatTokensBad, MaskFileMissingShortOrCorrupt) {
  const std::string d = loom::test::scoped_dir("chat_tokens_bad_mask");
  write_dataset(d + "/a", data::TokenDType::UInt16, {{1, 2, 3}, {4, 5}});
  expect_error([&] { data::ChatTokenFile f(d + "/a"); }, {"a.mask.idx", "loom tokenize --chat"});
  write_dataset(d + "/a.mask", data::TokenDType::UInt8, {{0, 1, 1}});
  expect_error([&] { data::ChatTokenFile f(d + "/a"); }, {"a.mask.idx", "1 sequences", "2"});
  write_dataset(d + "/a.mask", data::TokenDType::UInt8, {{0, 1, 1}, {1}});
  expect_error([&] { data::ChatTokenFile f(d + "/a"); }, {"a.mask.idx", "sequence 1", "1 mask"});
  write_dataset(d + "/a.mask", data::TokenDType::UInt16, {{0, 1, 1}, {1, 1}});
  expect_error([&] { data::ChatTokenFile f(d + "/a"); }, {"a.mask.idx", "uint8"});
  write_dataset(d + "/a.mask", data::TokenDType::UInt8, {{0, 1, 1}, {1, 2}});
  data::ChatTokenFile f(d + "/a");
  EXPECT_EQ(f.example(0).mask, (std::vector<uint8_t>{0, 1, 1}));
  expect_error([&] { f.example(1); }, {"a.mask.bin", "sequence 1", "mask value 2"});
}

TEST(ChatTokensBad, IdsPastTheVocabularyAreErrors) {
  const std::string d = loom::test::scoped_dir("chat_tokens_bad_vocab");
  write_dataset(d + "/a", data::TokenDType::UInt16, {{1, 2, 3}, {4, 300}});
  write_dataset(d + "/a.mask", data::TokenDType::UInt8, {{0, 1, 1}, {1, 1}});
  ChatSource s(d + "/a", 260, 1, 8, false, 1, 0.0, "train");
  Batch b;
  expect_error(
      [&] {
        for (int i = 0; i < 4; ++i) s.next(b);
      },
      {"a.bin", "example 1", "token id 300", "260"});
}
