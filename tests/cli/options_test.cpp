// The option parser's list values (Options::values, e.g. --served-model-name A B): every
// argument up to the next option, repeated occurrences appended, an inline first value, and
// none at all refused naming the option.
#include <gtest/gtest.h>

#include "cli/options.h"
#include "core/error.h"

using namespace loom;
using namespace loom::cli;

namespace {

Options names() {
  Options o("loom x", "");
  o.values("served-model-name", "names").value("port", "8080", "port").flag("quiet", "q");
  return o;
}

}  // namespace

TEST(Options, ValuesTakeEveryArgumentUpToTheNextOption) {
  Options o = names();
  ASSERT_TRUE(o.parse({"--served-model-name", "a", "b", "c", "--port", "9", "--quiet"}));
  EXPECT_EQ(o.all("served-model-name"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(o.get("served-model-name"), "a");
  EXPECT_TRUE(o.has("served-model-name"));
  EXPECT_EQ(o.get("port"), "9");
  EXPECT_TRUE(o.has("quiet"));
  Options inl = names();
  ASSERT_TRUE(inl.parse({"--served-model-name=x", "y", "--served-model-name", "z"}));
  EXPECT_EQ(inl.all("served-model-name"), (std::vector<std::string>{"x", "y", "z"}));
  Options none = names();
  ASSERT_TRUE(none.parse({"--port", "1"}));
  EXPECT_FALSE(none.has("served-model-name"));
  EXPECT_TRUE(none.all("served-model-name").empty());
  Options empty = names();
  try {
    empty.parse({"--served-model-name", "--quiet"});
    FAIL() << "no names accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--served-model-name needs a value"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(names().help().find("--served-model-name V..."), std::string::npos);
}
