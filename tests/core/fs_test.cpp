#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "temp_dir.h"

using namespace loom;

TEST(Fs, AtomicFileCommitsOrLeavesNothing) {
  loom::test::TempDir tmp("fs_test");
  std::string dir = tmp.path;
  std::string path = dir + "/out.txt";
  {
    AtomicFile f(path);
    f.write("half");
    // destroyed without commit: nothing appears
  }
  EXPECT_FALSE(file_exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  write_file_atomic(path, "hello");
  EXPECT_EQ(read_file(path), "hello");
  MappedFile m(path);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m.data()[4], 'o');
  EXPECT_THROW(read_file(dir + "/missing"), Error);
  EXPECT_THROW(MappedFile(dir + "/missing"), Error);
  remove_all(dir);
}
