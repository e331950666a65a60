#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/indexed_dataset.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::data;

namespace {

const std::string kMeg = std::string(LOOM_DATA_FIXTURES) + "/megatron";

std::vector<std::vector<int32_t>> fixture_docs() {
  Json j = Json::parse(read_file(kMeg + "/fixture_docs.json"), "fixture_docs.json");
  std::vector<std::vector<int32_t>> docs;
  for (auto& d : j.at("documents").as_array()) {
    docs.emplace_back();
    for (auto& t : d.as_array()) docs.back().push_back(int32_t(t.as_int()));
  }
  return docs;
}

std::string tmp(const std::string& name) {
  return loom::test::this_test_dir() + "/" + name;
}

// Expects constructing a reader over prefix to fail with a message containing `what`.
void expect_rejected(const std::string& prefix, const std::string& what) {
  try {
    IndexedDataset ds(prefix);
    FAIL() << "accepted a corrupt dataset; expected: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(IndexedDataset, WriterIsByteIdenticalToMegatron) {
  auto docs = fixture_docs();
  ASSERT_EQ(docs.size(), 9u);
  for (auto [name, dtype] : {std::pair{"fixture_u16", TokenDType::UInt16},
                             std::pair{"fixture_i32", TokenDType::Int32}}) {
    std::string out = tmp(name);
    IndexedDatasetWriter w(out, dtype);
    for (auto& d : docs) w.add_document(d);
    w.finalize();
    EXPECT_EQ(read_file(out + ".bin"), read_file(kMeg + "/" + name + ".bin")) << name;
    EXPECT_EQ(read_file(out + ".idx"), read_file(kMeg + "/" + name + ".idx")) << name;
  }
}

TEST(IndexedDataset, ReaderReturnsTheFixtureDocuments) {
  auto docs = fixture_docs();
  for (const char* name : {"fixture_u16", "fixture_i32"}) {
    IndexedDataset ds(kMeg + "/" + name);
    ASSERT_EQ(ds.num_documents(), int64_t(docs.size()));
    ASSERT_EQ(ds.num_sequences(), int64_t(docs.size()));
    uint64_t total = 0;
    for (size_t k = 0; k < docs.size(); ++k) {
      EXPECT_EQ(ds.document(int64_t(k)), docs[k]) << name << " doc " << k;
      total += docs[k].size();
    }
    EXPECT_EQ(ds.num_tokens(), total);
    std::vector<int32_t> part(3);
    ds.read(5, 2, 3, part.data());
    EXPECT_EQ(part, std::vector<int32_t>(docs[5].begin() + 2, docs[5].begin() + 5));
  }
  EXPECT_EQ(IndexedDataset(kMeg + "/fixture_u16").dtype(), TokenDType::UInt16);
  EXPECT_EQ(IndexedDataset(kMeg + "/fixture_i32").dtype(), TokenDType::Int32);
}

TEST(IndexedDataset, MultiSequenceDocumentsAndLargeCountsRoundTrip) {
  std::string out = tmp("multi");
  IndexedDatasetWriter w(out, TokenDType::Int32);
  std::vector<std::vector<int32_t>> expect;
  for (int d = 0; d < 2000; ++d) {
    std::vector<int32_t> doc;
    for (int s = 0; s < 1 + d % 3; ++s) {
      std::vector<int32_t> seq(size_t(d % 7), d * 10 + s);
      if (d % 11 == 0) seq.push_back(100000 + d);  // beyond uint16
      w.add_sequence(seq);
      doc.insert(doc.end(), seq.begin(), seq.end());
    }
    w.end_document();
    expect.push_back(doc);
  }
  w.finalize();
  IndexedDataset ds(out);
  ASSERT_EQ(ds.num_documents(), 2000);
  for (int d = 0; d < 2000; d += 37) EXPECT_EQ(ds.document(d), expect[size_t(d)]);
}

TEST(IndexedDataset, UnfinishedWriterLeavesNoFilesAndRejectsOversizedTokens) {
  std::string out = tmp("unfinished");
  {
    IndexedDatasetWriter w(out, TokenDType::UInt16);
    w.add_document(std::vector<int32_t>{1, 2, 3});
    EXPECT_THROW(w.add_document(std::vector<int32_t>{70000}), Error);
  }
  EXPECT_FALSE(file_exists(out + ".bin"));
  EXPECT_FALSE(file_exists(out + ".idx"));
  for (auto& e : std::filesystem::directory_iterator(loom::test::this_test_dir()))
    EXPECT_EQ(e.path().string().find("unfinished"), std::string::npos) << e.path();
}

TEST(IndexedDataset, CorruptFilesGiveClearErrors) {
  const std::string idx = read_file(kMeg + "/fixture_u16.idx");
  const std::string bin = read_file(kMeg + "/fixture_u16.bin");
  auto make = [&](const std::string& name, std::string i, std::string b) {
    std::string p = tmp(name);
    write_file_atomic(p + ".idx", i);
    write_file_atomic(p + ".bin", b);
    return p;
  };
  expect_rejected(make("short_header", idx.substr(0, 20), bin), "truncated header");
  std::string bad_magic = idx;
  bad_magic[0] = 'X';
  expect_rejected(make("magic", bad_magic, bin), "bad magic");
  std::string bad_version = idx;
  bad_version[9] = 2;
  expect_rejected(make("version", bad_version, bin), "unsupported version 2");
  std::string bad_dtype = idx;
  bad_dtype[17] = 42;
  expect_rejected(make("dtype", bad_dtype, bin), "unknown dtype code 42");
  expect_rejected(make("truncated_idx", idx.substr(0, idx.size() - 8), bin), "does not match");
  expect_rejected(make("truncated_bin", idx, bin.substr(0, bin.size() - 10)), "lies outside");
  std::string bad_docs = idx;
  bad_docs[idx.size() - 8] = 3;  // last document index no longer equals the sequence count
  expect_rejected(make("docs", bad_docs, bin), "document");
  expect_rejected(tmp("does_not_exist"), "cannot open");
}
