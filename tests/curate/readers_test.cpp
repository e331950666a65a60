#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>

#include "core/fs.h"
#include "curate/readers.h"
#include "curate/writer.h"
#include "helpers.h"

using namespace loom::curate;
using loom::curate::test::TempDir;

struct ReadAll {
  std::vector<Doc> docs;
  std::vector<std::string> rejects;
  std::vector<ReadError> errors;
};

static ReadAll read_all(const std::vector<std::string>& files, ReaderOptions opt) {
  InputShard s;
  s.files = files;
  auto r = open_reader(s, opt);
  ReadAll out;
  Doc d;
  std::string reject;
  while (r->next(d, reject)) {
    out.docs.push_back(d);
    out.rejects.push_back(reject);
  }
  out.errors = r->errors;
  return out;
}

TEST(Readers, JsonlFieldsIdsAndMalformedLines) {
  TempDir t;
  std::string big(3000, 'x');
  loom::write_file_atomic(t / "a.jsonl",
                          "{\"doc_id\": \"a1\", \"body\": \"first\", \"url\": \"http://x\"}\n"
                          "\n"
                          "{\"doc_id\": 7, \"body\": \"numeric id\"}\n"
                          "{\"body\": \"no id\"}\n"
                          "{\"doc_id\": \"a4\", \"body\": \"unterminated\n"
                          "[1, 2]\n"
                          "{\"doc_id\": \"a6\", \"title\": \"no body\"}\n"
                          "{\"doc_id\": \"a7\", \"body\": \"" +
                              big + "\"}\n" + std::string("\0\1\xFF binary junk\n", 16) +
                              "{\"doc_id\": \"a9\", \"body\": \"last, no newline\"}");
  ReaderOptions o;
  o.text_field = "body";
  o.id_field = "doc_id";
  o.max_line_bytes = 1000;
  ReadAll r = read_all({t / "a.jsonl"}, o);
  ASSERT_EQ(r.docs.size(), 9u);
  EXPECT_EQ(r.docs[0].id, "a1");
  EXPECT_EQ(r.docs[0].text, "first");
  EXPECT_EQ(r.docs[0].record.at("url").as_string(), "http://x");
  EXPECT_FALSE(r.docs[0].record.contains("body"));
  EXPECT_EQ(r.docs[1].id, "7");
  EXPECT_EQ(r.docs[2].id, t / "a.jsonl:4");  // derived from file and line, and said so
  EXPECT_TRUE(r.docs[2].record.at("id_derived").as_bool());
  std::vector<std::string> want = {"",
                                   "",
                                   "",
                                   "malformed_json",
                                   "not_an_object",
                                   "missing_text_field",
                                   "line_too_long",
                                   "malformed_json",
                                   ""};
  EXPECT_EQ(r.rejects, want);
  ASSERT_EQ(r.errors.size(), 5u);
  EXPECT_EQ(r.errors[0].where, t / "a.jsonl:5");
  EXPECT_NE(r.errors[0].message.find("malformed JSON"), std::string::npos);
  EXPECT_EQ(r.docs[8].text, "last, no newline");

  o.fail_on_error = true;
  try {
    read_all({t / "a.jsonl"}, o);
    FAIL() << "expected an error";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find(t / "a.jsonl:5"), std::string::npos) << e.what();
  }
}

static void gz_append(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "ab");
  gzwrite(f, data.data(), static_cast<unsigned>(data.size()));
  gzclose(f);
}

static std::string warc_record(const std::string& type, const std::string& uri,
                               const std::string& ctype, const std::string& payload) {
  return "WARC/1.0\r\nWARC-Type: " + type + "\r\nWARC-Target-URI: " + uri +
         "\r\nWARC-Date: 2024-01-01T00:00:00Z\r\nWARC-Record-ID: <urn:uuid:" +
         uri.substr(uri.size() - 1) + ">\r\nContent-Type: " + ctype +
         "\r\nContent-Length: " + std::to_string(payload.size()) + "\r\n\r\n" + payload +
         "\r\n\r\n";
}

TEST(Readers, WarcGzipMultiMember) {
  TempDir t;
  std::string path = t / "crawl.warc.gz";
  std::string html = "<html><body><p>Hello from the web.</p></body></html>";
  gz_append(path,
            warc_record("warcinfo", "urn:info:0", "application/warc-fields", "software: test\r\n"));
  gz_append(path, warc_record("request", "http://a.example/1", "application/http; msgtype=request",
                              "GET /1 HTTP/1.1\r\nHost: a.example\r\n\r\n"));
  gz_append(path, warc_record(
                      "response", "http://a.example/1", "application/http; msgtype=response",
                      "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n" + html));
  gz_append(path,
            warc_record("response", "http://a.example/2", "application/http; msgtype=response",
                        "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n\r\n\x89PNG\x00\x01"));
  gz_append(path,
            warc_record("conversion", "http://a.example/3", "text/plain", "Plain extracted text."));
  ReaderOptions o;
  o.format = "warc";
  ReadAll r = read_all({path}, o);
  ASSERT_EQ(r.docs.size(), 3u);
  EXPECT_EQ(r.docs[0].text, html);
  EXPECT_EQ(r.docs[0].id, "<urn:uuid:1>");
  EXPECT_EQ(r.docs[0].record.at("url").as_string(), "http://a.example/1");
  EXPECT_EQ(r.docs[0].record.at("content_type").as_string(), "text/html");
  EXPECT_EQ(r.rejects[1], "unsupported_content_type");
  EXPECT_EQ(r.docs[2].text, "Plain extracted text.");
  EXPECT_EQ(r.rejects[2], "");
  EXPECT_TRUE(r.errors.empty());
}

TEST(Readers, TruncatedGzipIsReportedNotFatal) {
  TempDir t;
  std::string path = t / "docs.jsonl.gz";
  std::string body;
  for (int i = 0; i < 2000; ++i)
    body += "{\"id\": \"d" + std::to_string(i) + "\", \"text\": \"document number " +
            std::to_string(i * 7919) + "\"}\n";
  gz_append(path, body);
  std::string whole = loom::read_file(path);
  loom::write_file_atomic(path, whole.substr(0, whole.size() / 2));
  ReadAll r = read_all({path}, ReaderOptions());
  ASSERT_GT(r.docs.size(), 10u);
  EXPECT_LT(r.docs.size(), 2000u);
  // Every document read whole is intact; the line the stream cut is a document rejected as
  // stream_error holding the bytes decoded of it, so the decoded bytes are all accounted for:
  // together they are a prefix of the original body, ending inside a line.
  for (size_t i = 0; i + 1 < r.rejects.size(); ++i) EXPECT_EQ(r.rejects[i], "") << i;
  EXPECT_EQ(r.rejects.back(), "stream_error");
  int64_t decoded = 0;
  for (auto& d : r.docs) decoded += d.input_bytes;
  const int64_t partial = r.docs.back().input_bytes;
  EXPECT_GT(partial, 0);
  EXPECT_NE(body[size_t(decoded) - 1], '\n');            // cut inside a line
  EXPECT_EQ(body[size_t(decoded - partial) - 1], '\n');  // after the last whole line
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("truncated gzip"), std::string::npos) << r.errors[0].message;
  EXPECT_NE(r.errors[0].message.find(path), std::string::npos);
  ReaderOptions strict;
  strict.fail_on_error = true;
  EXPECT_THROW(read_all({path}, strict), loom::Error);
}

TEST(Readers, ZstdRoundTripAndEmptyFile) {
  TempDir t;
  {
    JsonlWriter w(t / "a.jsonl.zst", true);
    for (int i = 0; i < 500; ++i)
      w.write_line("{\"id\": " + std::to_string(i) + ", \"text\": \"t" + std::to_string(i) + "\"}");
    w.commit();
  }
  ReadAll r = read_all({t / "a.jsonl.zst"}, ReaderOptions());
  ASSERT_EQ(r.docs.size(), 500u);
  EXPECT_EQ(r.docs[499].text, "t499");
  loom::write_file_atomic(t / "empty.jsonl", "");
  EXPECT_EQ(read_all({t / "empty.jsonl"}, ReaderOptions()).docs.size(), 0u);
}

TEST(Readers, HtmlDirectoryShardsAndTextFiles) {
  auto shards = plan_shards({std::string(CURATE_TEST_DATA) + "/html"}, "html", 2);
  ASSERT_EQ(shards.size(), 2u);  // 3 files, 2 per shard
  EXPECT_EQ(shards[0].files.size(), 2u);
  ReaderOptions o;
  o.format = "html";
  ReadAll r = read_all(shards[0].files, o);
  ASSERT_EQ(r.docs.size(), 2u);
  EXPECT_EQ(r.docs[0].record.at("content_type").as_string(), "text/html");
  EXPECT_THROW(plan_shards({"/nonexistent/path"}, "jsonl", 1), loom::Error);
  TempDir t;
  loom::write_file_atomic(t / "one.txt", "A plain text document.\n");
  o.format = "text";
  ReadAll tx = read_all({t / "one.txt"}, o);
  ASSERT_EQ(tx.docs.size(), 1u);
  EXPECT_EQ(tx.docs[0].id, t / "one.txt");
  EXPECT_EQ(tx.docs[0].text, "A plain text document.\n");
}

TEST(Readers, UnreadableInputEntryIsAnErrorNamingItsPath) {
  // Tests run as root, where permissions do not bite: a symlink loop is an entry whose type
  // cannot be read (ELOOP), which the directory iterator once reported as "internal error:
  // filesystem error" without the path.
  TempDir t;
  loom::make_dirs(t / "in/sub");
  loom::write_file_atomic(t / "in/a.jsonl", "{\"text\": \"x\"}\n");
  std::filesystem::create_symlink(t / "in/sub/loop", t / "in/sub/loop");
  try {
    plan_shards({t / "in"}, "jsonl", 1);
    FAIL() << "expected an error";
  } catch (const loom::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(t / "in/sub/loop"), std::string::npos) << m;
    EXPECT_NE(m.find("cannot read input"), std::string::npos) << m;
  }
  // A file where a directory is expected (in/a.jsonl/x): the path is named too.
  try {
    plan_shards({t / "in/a.jsonl/x"}, "jsonl", 1);
    FAIL() << "expected an error";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find(t / "in/a.jsonl/x"), std::string::npos) << e.what();
  }
}
