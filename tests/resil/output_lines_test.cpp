#include "resil/output_lines.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace loom::resil {
namespace {

using Pieces = std::vector<std::pair<std::string, bool>>;

Pieces split(const std::vector<std::string>& chunks, size_t max_line) {
  LineSplitter s(max_line);
  Pieces out;
  auto emit = [&](std::string_view l, bool cont) { out.emplace_back(std::string(l), cont); };
  for (auto& c : chunks) s.feed(c, emit);
  s.finish(emit);
  return out;
}

TEST(OutputLines, LinesAreSplitAtNewlinesAcrossChunks) {
  Pieces p = split({"ab", "c\nde", "f\n\ng"}, 100);
  Pieces want = {{"abc", false}, {"def", false}, {"", false}, {"g", false}};
  EXPECT_EQ(p, want);
}

TEST(OutputLines, ALongLineIsCutIntoPiecesOfTheBound) {
  Pieces p = split({std::string(10, 'x'), "y\nz"}, 4);
  Pieces want = {{"xxxx", false}, {"xxxx", true}, {"xxy", true}, {"z", false}};
  EXPECT_EQ(p, want);
  // A piece that ends at the bound, then the newline: no empty piece.
  p = split({"abcdefgh\nk\n"}, 4);
  want = {{"abcd", false}, {"efgh", true}, {"k", false}};
  EXPECT_EQ(p, want);
}

TEST(OutputLines, ACutDoesNotSplitAUtf8Character) {
  // "ab" then a 3-byte character across the bound of 4: the piece ends before it.
  Pieces p = split({"ab\xE2\x82\xAC"
                    "cd\n"},
                   4);
  Pieces want = {{"ab", false},
                 {"\xE2\x82\xAC"
                  "c",
                  true},
                 {"d", true}};
  EXPECT_EQ(p, want);
  // Bytes that are not UTF-8 are cut at the bound.
  p = split({std::string(9, '\x80')}, 4);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].first.size(), 4u);
}

TEST(OutputLines, MemoryStaysBoundedOnAnEndlessLine) {
  LineSplitter s(1000);
  size_t pieces = 0, bytes = 0;
  auto emit = [&](std::string_view l, bool) {
    ++pieces;
    bytes += l.size();
    EXPECT_LE(l.size(), 1000u);
  };
  std::string chunk(65536, 'x');
  for (int i = 0; i < 100; ++i) s.feed(chunk, emit);
  s.finish(emit);
  EXPECT_EQ(bytes, 100u * 65536u);
  EXPECT_EQ(pieces, (bytes + 999) / 1000);
}

TEST(OutputLines, TagsAreRead) {
  std::string_view text;
  EXPECT_EQ(untag("[1,3]<stdout>:hello", &text), 3);
  EXPECT_EQ(text, "hello");
  EXPECT_EQ(untag("[12,0]<stderr>:", &text), 0);
  EXPECT_EQ(text, "");
  EXPECT_EQ(untag("[1,3]<stdout>:a\rb", &text), 3);  // a progress bar's carriage return
  EXPECT_EQ(text, "a\rb");
  for (const char* bad : {"[1,3]<stdin>:x", "[1,]<stdout>:x", "[,3]<stdout>:x", "1,3]<stdout>:x",
                          "[1,99999999999999999999]<stdout>:x", "[1,3]<stdout>", ""}) {
    EXPECT_EQ(untag(bad, &text), -1) << bad;
    EXPECT_EQ(text, bad);
  }
}

TEST(OutputLines, ErrorMessagesAndRanksAreFound) {
  int rank = -1;
  std::string_view msg;
  EXPECT_TRUE(rank_failed_message("x loom: rank 12 failed: out of memory", &rank, &msg));
  EXPECT_EQ(rank, 12);
  EXPECT_EQ(msg, "out of memory");
  EXPECT_TRUE(rank_failed_message("loom: rank x loom: rank 2 failed: y", &rank, &msg));
  EXPECT_EQ(rank, 2);
  EXPECT_FALSE(rank_failed_message("loom: rank 123456789012 failed: y", &rank, &msg));
  EXPECT_FALSE(rank_failed_message("loom: rank 1 failed:", &rank, &msg));

  EXPECT_TRUE(command_error_message("loom train: error: no such preset", &msg));
  EXPECT_EQ(msg, "no such preset");
  EXPECT_TRUE(command_error_message("loom train: internal error: bad", &msg));
  EXPECT_EQ(msg, "bad");
  EXPECT_FALSE(command_error_message(" loom train: error: x", &msg));
  EXPECT_FALSE(command_error_message("loom : error: x", &msg));
  EXPECT_FALSE(command_error_message("loom train: warning: x", &msg));

  EXPECT_TRUE(mpi_reported_rank("Primary job terminated: process rank 5 with PID", &rank));
  EXPECT_EQ(rank, 5);
  EXPECT_TRUE(mpi_reported_rank("  Process name: [[4711,1],3]", &rank));
  EXPECT_EQ(rank, 3);
  EXPECT_FALSE(mpi_reported_rank("Process name: [[4711,1]", &rank));
  EXPECT_FALSE(mpi_reported_rank("process rank 99999999999999", &rank));
}

TEST(OutputLines, LongLinesAreScannedWithoutRecursion) {
  // The scanners are loops: a line of megabytes costs time linear in it, no stack.
  std::string line = "[1,0]<stdout>:loom " + std::string(8 << 20, 'x');
  std::string_view text;
  EXPECT_EQ(untag(line, &text), 0);
  std::string_view msg;
  int rank;
  EXPECT_FALSE(command_error_message(text, &msg));
  EXPECT_FALSE(rank_failed_message(text, &rank, &msg));
  EXPECT_FALSE(mpi_reported_rank(text, &rank));
}

TEST(OutputLines, PrintableUtf8ReplacesBadBytesAndCutsAtCharacters) {
  EXPECT_EQ(printable_utf8("ok \xC3\xA9", 100), "ok \xC3\xA9");
  EXPECT_EQ(printable_utf8("a\xFF"
                           "b",
                           100),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(printable_utf8("\xED\xA0\x80", 100),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(printable_utf8("ab\xC3\xA9", 3), "ab");
  EXPECT_EQ(printable_utf8(std::string("a\0b", 3), 10), std::string("a\0b", 3));
}

}  // namespace
}  // namespace loom::resil
