#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"

using namespace loom;

TEST(Config, SectionsTypesAndOverrides) {
  Config c = Config::parse(
      "name = \"run # 1\"  # comment\n[model]\nlayers = 4\nwidth=64\n[optim]\nlr = 3e-4\n"
      "clip = true\n",
      "x.toml");
  c.set_override("model.layers=6");
  EXPECT_EQ(c.get_string("name", ""), "run # 1");
  EXPECT_EQ(c.get_int("model.layers", 0), 6);
  EXPECT_EQ(c.get_int("model.width", 0), 64);
  EXPECT_DOUBLE_EQ(c.get_double("optim.lr", 0), 3e-4);
  EXPECT_TRUE(c.get_bool("optim.clip", false));
  EXPECT_EQ(c.get_int("model.absent", 7), 7);
  EXPECT_NO_THROW(c.check_all_used());
}

TEST(Config, UnknownKeyNamesKeyAndLocation) {
  Config c = Config::parse("[model]\nlayers = 4\nlayrs = 5\n", "run.toml");
  c.get_int("model.layers", 0);
  try {
    c.check_all_used();
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("model.layrs"), std::string::npos) << m;
    EXPECT_NE(m.find("run.toml:3"), std::string::npos) << m;
  }
}

TEST(Config, BadValuesAreErrors) {
  Config c = Config::parse("a = 4x\nb = \"3\"\nc = yes\n", "t.toml");
  EXPECT_THROW(c.get_int("a", 0), Error);
  EXPECT_THROW(c.get_int("b", 0), Error);
  EXPECT_THROW(c.get_bool("c", false), Error);
  EXPECT_THROW(Config::parse("[oops\n", "t"), Error);
  EXPECT_THROW(Config::parse("novalue\n", "t"), Error);
  EXPECT_THROW(Config::parse("a = 1\na = 2\n", "t"), Error);
  Config d;
  EXPECT_THROW(d.set_override("noequals"), Error);
}
