// TensorBoard event files: CRC-32C against the published check values, and a written file read
// back through its TFRecord framing and protobuf fields by an independent decoder.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "core/tfevents.h"
#include "core/tfevents_reader.h"
#include "temp_dir.h"

using namespace loom;

TEST(TfEvents, Crc32cMatchesTheStandardCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);              // the CRC catalogue's check value
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);    // RFC 3720, B.4
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(""), 0u);
  uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TfEvents, WrittenScalarsReadBack) {
  loom::test::TempDir tmp("tfevents");
  std::string dir = tmp / "events";
  std::string path;
  {
    TfEventsWriter w(dir);
    path = w.path();
    w.scalars(1, 1700000000.5, {{"loss", 6.25}, {"lr", 3e-4}});
    w.scalars(300, 1700000001.25, {{"valid_loss", 5.5}});
  }
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::vector<test::Event> ev = test::read_events(path);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_EQ(ev[1].step, 1);
  EXPECT_EQ(ev[1].wall_time, 1700000000.5);
  EXPECT_EQ(ev[1].scalars.at("loss"), 6.25f);
  EXPECT_EQ(ev[1].scalars.at("lr"), 3e-4f);
  EXPECT_EQ(ev[2].step, 300);  // a multi-byte varint
  EXPECT_EQ(ev[2].scalars.size(), 1u);
  EXPECT_EQ(ev[2].scalars.at("valid_loss"), 5.5f);
}

TEST(TfEvents, UnwritableDirectoryIsAnError) {
  loom::test::TempDir tmp("tfevents");
  std::string file = tmp / "file";
  write_file_atomic(file, "x");
  EXPECT_THROW(TfEventsWriter w(file + "/sub"), Error);
}
