// The WARC reader accounts for every byte it reads: documents carry the bytes really read for
// them (not a header's claim), malformed stretches become documents rejected with a reason,
// and the reader resynchronises on the next record instead of losing the rest of the file.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <string>

#include "core/config.h"
#include "core/fs.h"
#include "curate/pipeline.h"
#include "curate/readers.h"
#include "helpers.h"

using namespace loom;
using namespace loom::curate;
using loom::curate::test::TempDir;

namespace {

std::string record(const std::string& type, int n, const std::string& payload,
                   const std::string& length = "") {
  return "WARC/1.0\r\nWARC-Type: " + type + "\r\nWARC-Target-URI: http://x.example/" +
         std::to_string(n) + "\r\nWARC-Record-ID: <urn:uuid:" + std::to_string(n) +
         ">\r\nContent-Type: text/html\r\nContent-Length: " +
         (length.empty() ? std::to_string(payload.size()) : length) + "\r\n\r\n" + payload +
         "\r\n\r\n";
}

std::string page(const std::string& words) {
  return "<html><body><p>" + words + "</p></body></html>";
}

struct Read {
  std::vector<Doc> docs;
  std::vector<std::string> rejects;
  std::vector<ReadError> errors;
  int64_t bytes = 0, non_document_bytes = 0, non_document_records = 0;
  uint64_t unread = 0;
  int64_t stream_errors = 0;
};

Read read_warc(const std::string& path) {
  InputShard s;
  s.files = {path};
  ReaderOptions o;
  o.format = "warc";
  auto r = open_reader(s, o);
  Read out;
  Doc d;
  std::string reject;
  while (r->next(d, reject)) {
    out.bytes += d.input_bytes;
    out.docs.push_back(d);
    out.rejects.push_back(reject);
  }
  out.errors = r->errors;
  out.non_document_bytes = r->non_document_bytes;
  out.non_document_records = r->non_document_records;
  out.unread = r->unread_bytes;
  out.stream_errors = r->stream_errors;
  return out;
}

}  // namespace

TEST(WarcAccounting, LyingContentLengthCountsOnlyBytesRead) {
  TempDir t;
  std::string ok = record("response", 1, page("First page."));
  // Claims 10 GB, holds 40 bytes: once counted as 10,000 MB read.
  std::string liar = record("response", 2, page("cut"), "10000000000");
  write_file_atomic(t / "a.warc", ok + liar);
  Read r = read_warc(t / "a.warc");
  ASSERT_EQ(r.docs.size(), 2u);
  EXPECT_EQ(r.rejects[0], "");
  EXPECT_EQ(r.docs[0].input_bytes, static_cast<int64_t>(ok.size()));
  EXPECT_EQ(r.rejects[1], "truncated_record");
  EXPECT_EQ(r.docs[1].input_bytes, static_cast<int64_t>(liar.size()));
  EXPECT_EQ(r.bytes, static_cast<int64_t>((ok + liar).size()));
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("Content-Length 10000000000"), std::string::npos)
      << r.errors[0].message;
}

TEST(WarcAccounting, JunkBetweenRecordsIsRejectedAndReadingResumes) {
  TempDir t;
  std::string a = record("response", 1, page("First page.")),
              junk = "garbage line one\nand two\r\n", b = record("response", 2, page("Second."));
  write_file_atomic(t / "a.warc", a + junk + b);
  Read r = read_warc(t / "a.warc");
  ASSERT_EQ(r.docs.size(), 3u);
  EXPECT_EQ(r.rejects[0], "");
  EXPECT_EQ(r.rejects[1], "not_a_warc_record");
  EXPECT_EQ(r.docs[1].input_bytes, static_cast<int64_t>(junk.size()));
  EXPECT_EQ(r.rejects[2], "");
  EXPECT_EQ(r.docs[2].text, page("Second."));
  EXPECT_EQ(r.bytes, static_cast<int64_t>((a + junk + b).size()));
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].where.find("a.warc:"), std::string::npos);
  EXPECT_NE(r.errors[0].message.find("garbage line one"), std::string::npos);
}

TEST(WarcAccounting, NegativeContentLengthIsABadHeaderAndTheNextRecordIsKept) {
  TempDir t;
  std::string bad = record("response", 1, page("Never read."), "-5"),
              good = record("response", 2, page("Kept page."));
  write_file_atomic(t / "a.warc", bad + good);
  Read r = read_warc(t / "a.warc");
  ASSERT_EQ(r.docs.size(), 2u);
  EXPECT_EQ(r.rejects[0], "bad_record_header");
  EXPECT_EQ(r.rejects[1], "");
  EXPECT_EQ(r.docs[1].text, page("Kept page."));
  EXPECT_EQ(r.bytes, static_cast<int64_t>((bad + good).size()));
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("Content-Length '-5' is not a byte count"), std::string::npos)
      << r.errors[0].message;
}

TEST(WarcAccounting, NonDocumentRecordsAreCountedWithTheirBytes) {
  TempDir t;
  std::string info = record("warcinfo", 0, "software: test\r\n"),
              req = record("request", 1, "GET / HTTP/1.1\r\n\r\n"),
              resp = record("response", 1, page("A page."));
  write_file_atomic(t / "a.warc", info + req + resp);
  Read r = read_warc(t / "a.warc");
  ASSERT_EQ(r.docs.size(), 1u);
  EXPECT_EQ(r.non_document_records, 2);
  EXPECT_EQ(r.non_document_bytes, static_cast<int64_t>((info + req).size()));
  EXPECT_EQ(r.bytes + r.non_document_bytes, static_cast<int64_t>((info + req + resp).size()));
  EXPECT_TRUE(r.errors.empty());
}

static std::string gzip_warc(const std::string& path, int records) {
  std::string body;
  for (int i = 0; i < records; ++i)
    body += record("response", i, page("Page " + std::to_string(i)));
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, body.data(), static_cast<unsigned>(body.size()));
  gzclose(f);
  return read_file(path);
}

TEST(WarcAccounting, TruncatedGzipRejectsThePartialRecordAndCountsTheStreamError) {
  TempDir t;
  std::string path = t / "a.warc.gz";
  std::string whole = gzip_warc(path, 4000);
  write_file_atomic(path, whole.substr(0, whole.size() / 2));
  Read r = read_warc(path);
  ASSERT_GT(r.docs.size(), 10u);
  for (size_t i = 0; i + 1 < r.docs.size(); ++i) EXPECT_EQ(r.rejects[i], "") << i;
  EXPECT_EQ(r.rejects.back(), "stream_error");  // the record the stream cut, not lost silently
  EXPECT_EQ(r.stream_errors, 1);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("truncated gzip"), std::string::npos) << r.errors[0].message;
  EXPECT_NE(r.errors[0].message.find("the rest of the file is unread"), std::string::npos);
}

TEST(WarcAccounting, CorruptGzipReportsTheBytesLeftUnread) {
  TempDir t;
  std::string path = t / "a.warc.gz";
  std::string whole = gzip_warc(path, 400);
  whole[whole.size() / 2] ^= 0x55;  // zlib: "invalid distance too far back"
  write_file_atomic(path, whole);
  Read r = read_warc(path);
  EXPECT_EQ(r.stream_errors, 1);
  EXPECT_GT(r.unread, 0u);
  EXPECT_LT(r.unread, whole.size());
  // Garbage decoded before zlib noticed becomes rejected junk; the stream error comes last.
  ASSERT_FALSE(r.errors.empty());
  EXPECT_NE(r.errors.back().message.find("corrupt gzip"), std::string::npos)
      << r.errors.back().message;
}

// ---- through the pipeline: the report's headline ----------------------------------------

static Json run_pipeline(const TempDir& t, const std::string& input, const std::string& stages) {
  std::string cfg = "[input]\nformat = \"warc\"\npaths = [\"" + input + "\"]\n[output]\ndir = \"" +
                    (t / "out") + "\"\n" + stages;
  Pipeline p(Config::parse(cfg, "test.toml"));
  RunOptions ro;
  ro.workers = 1;
  ro.progress_interval = 0;
  return p.run(ro);
}

TEST(WarcAccounting, ReportAccountsForEveryByteAndRejectsADeepPageAsTooDeep) {
  TempDir t;
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "<b>";  // one record could exhaust the memory
  std::string a = record("response", 1, page("A page with a few words in it.")), junk = "junk\n",
              bad = record("response", 2, page("x"), "-1"), b = record("response", 3, deep),
              req = record("request", 4, "GET / HTTP/1.1\r\n\r\n");
  std::string all = a + junk + bad + b + req;
  write_file_atomic(t / "in.warc", all);
  Json report = run_pipeline(t, t / "in.warc", "[stage.1]\ntype = \"html_extract\"\n");
  auto& reader = report.at("stages").as_array()[0];
  EXPECT_EQ(
      reader.at("bytes_in").as_int() + reader.at("counters").at("non_document_bytes").as_int(),
      static_cast<int64_t>(all.size()));
  EXPECT_EQ(reader.at("reasons").at("not_a_warc_record").as_int(), 1);
  EXPECT_EQ(reader.at("reasons").at("bad_record_header").as_int(), 1);
  auto& html = report.at("stages").as_array()[1];
  EXPECT_EQ(html.at("reasons").at("too_deep").as_int(), 1);
  EXPECT_EQ(report.at("output").at("kept_docs").as_int(), 1);
  EXPECT_EQ(report.at("output").at("rejected_docs").as_int(), 3);
  EXPECT_TRUE(report.at("output").at("all_input_accounted").as_bool());
  std::string text = read_file(t / "out/report.txt");
  EXPECT_NE(text.find("every input byte accounted for: 2 input errors, each a document rejected"),
            std::string::npos)
      << text;
  bool named = false;
  for (auto& e : std::filesystem::directory_iterator(t / "out/rejected"))
    named |= read_file(e.path().string()).find("max_depth = 1000") != std::string::npos;
  EXPECT_TRUE(named) << "the rejected record names the limit";
}

TEST(WarcAccounting, ReportHeadlineWarnsWhenInputIsLost) {
  TempDir t;
  std::string path = t / "in.warc.gz";
  std::string whole = gzip_warc(path, 4000);
  write_file_atomic(path, whole.substr(0, whole.size() / 2));
  Json report = run_pipeline(t, path, "");
  EXPECT_FALSE(report.at("output").at("all_input_accounted").as_bool());
  EXPECT_EQ(report.at("output").at("stream_errors").as_int(), 1);
  std::string text = read_file(t / "out/report.txt");
  EXPECT_NE(text.find("WARNING: input lost: 1 file cut short by a stream error"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("every input"), std::string::npos) << text;
}
