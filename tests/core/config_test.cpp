#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/config.h"
#include "core/config_int32.h"
#include "core/error.h"
#include "temp_dir.h"

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
  Config c = Config::parse("b = \"3\"\nc = \"yes\"\n", "t.toml");
  EXPECT_THROW(c.get_int("b", 0), Error);
  EXPECT_THROW(c.get_bool("c", false), Error);
  EXPECT_THROW(Config::parse("a = 4x\n", "t"), Error);
  EXPECT_THROW(Config::parse("[oops\n", "t"), Error);
  EXPECT_THROW(Config::parse("novalue\n", "t"), Error);
  EXPECT_THROW(Config::parse("a = 1\na = 2\n", "t"), Error);
  Config d;
  EXPECT_THROW(d.set_override("noequals"), Error);
}

// The message of the loom::Error that `f` throws ("" when it throws none).
template <typename F>
static std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

static void expect_contains(const std::string& m, const std::vector<std::string>& parts) {
  EXPECT_FALSE(m.empty()) << "no error";
  for (auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
}

TEST(Config, SyntaxErrorsNameFileLineAndColumn) {
  // Each of these was accepted by the hand-written parser.
  expect_contains(error_of([] { Config::parse("a = 1\nname = \"abc\n", "run.toml"); }),
                  {"run.toml:2:", "name"});
  expect_contains(error_of([] { Config::parse("name = \"abc\" xyz\n", "run.toml"); }),
                  {"run.toml:1:", "name"});
  expect_contains(error_of([] { Config::parse("[model]\nlayers = 4 4\n", "run.toml"); }),
                  {"run.toml:2:"});
  // The column is there too: "file:line:column: ...".
  std::string m = error_of([] { Config::parse("x = 1\ny = [1, 2\n", "c.toml"); });
  ASSERT_EQ(m.rfind("c.toml:", 0), 0u) << m;
  EXPECT_TRUE(isdigit(static_cast<unsigned char>(m[m.find(':', 7) + 1]))) << m;
}

TEST(Config, FullTomlStringsArraysAndTables) {
  Config c = Config::parse(
      "lit = 'a # b'  # comment\n"
      "esc = \"tab\\there \\\"q\\\"\"\n"
      "xs = [\n  \"one\",  # first\n  \"two\",\n]\n"
      "ws = [0.7, 0.3]\n"
      "[a.b]\nc = 1\n"
      "[m]\ninline = { x = 2, y = \"s\" }\n"
      "dotted.z = true\n",
      "f.toml");
  EXPECT_EQ(c.get_string("lit", ""), "a # b");
  EXPECT_EQ(c.get_string("esc", ""), "tab\there \"q\"");
  EXPECT_EQ(c.get_string_list("xs", {}), (std::vector<std::string>{"one", "two"}));
  EXPECT_EQ(c.get_string_list("ws", {}), (std::vector<std::string>{"0.7", "0.3"}));
  EXPECT_EQ(c.get_int("a.b.c", 0), 1);
  EXPECT_EQ(c.get_int("m.inline.x", 0), 2);
  EXPECT_EQ(c.get_string("m.inline.y", ""), "s");
  EXPECT_TRUE(c.get_bool("m.dotted.z", false));
  EXPECT_EQ(c.get_string("xs", ""), "[\"one\", \"two\"]");  // JSON too, for curate's lists
  EXPECT_NO_THROW(c.check_all_used());
}

TEST(Config, StringListAcceptsCommaSeparatedString) {
  Config c = Config::parse("p = \"/a, /b,,/c\"\n", "t");
  c.set_override("q=/x,/y");
  EXPECT_EQ(c.get_string_list("p", {}), (std::vector<std::string>{"/a", "/b", "/c"}));
  EXPECT_EQ(c.get_string_list("q", {}), (std::vector<std::string>{"/x", "/y"}));
  EXPECT_EQ(c.get_string_list("absent", {"d"}), (std::vector<std::string>{"d"}));
}

TEST(Config, LoadFailsNamingThePath) {
  loom::test::TempDir scratch("config");  // removed pass or fail (a fixed /tmp name was left)
  const std::string dir = scratch.path;
  expect_contains(error_of([&] { Config::load(dir); }), {dir, "cannot open", "directory"});
  expect_contains(error_of([&] { Config::load(dir + "/missing.toml"); }),
                  {dir + "/missing.toml", "cannot open", "no such file"});
  const std::string file = dir + "/ok.toml";
  std::ofstream(file) << "[train]\nsteps = 3\n";
  EXPECT_EQ(Config::load(file).get_int("train.steps", 0), 3);
  expect_contains(error_of([&] {
                    std::ofstream(file) << "[train]\nsteps = 1e30\n";
                    Config::load(file).get_int("train.steps", 0);
                  }),
                  {file + ":2", "train.steps"});
}

TEST(Config, TypeAndRangeErrorsNameKeyAndWhereSet) {
  Config c = Config::parse("steps = 1e30\nname = \"abc\"\nlr = inf\nflag = 1\n", "t.toml");
  expect_contains(error_of([&] { c.get_int("steps", 0); }), {"'steps'", "t.toml:1", "1e+30"});
  expect_contains(error_of([&] { c.get_int("name", 0); }), {"'name'", "t.toml:2", "abc"});
  expect_contains(error_of([&] { c.get_double("name", 0); }), {"'name'", "t.toml:2"});
  expect_contains(error_of([&] { c.get_double("lr", 0); }), {"'lr'", "t.toml:3", "finite"});
  expect_contains(error_of([&] { c.get_bool("flag", false); }), {"'flag'", "t.toml:4"});
  // An integer too large for 64 bits: in a file it is a syntax error on that line (naming the
  // line's text, so the key); from the command line it is a range error naming the key.
  expect_contains(
      error_of([] { Config::parse("x = 1\nsteps = 99999999999999999999\n", "o.toml"); }),
      {"o.toml:2:", "steps"});
  Config o;
  o.set_override("train.steps=99999999999999999999");
  o.set_override("train.lr=abc");
  o.set_override("train.warmup=1e30");
  expect_contains(error_of([&] { o.get_int("train.steps", 0); }),
                  {"command line", "'train.steps'", "range"});
  expect_contains(error_of([&] { o.get_double("train.lr", 0); }), {"command line", "'train.lr'"});
  expect_contains(error_of([&] { o.get_int("train.warmup", 0); }),
                  {"command line", "'train.warmup'"});
  // An integer is a valid double.
  Config i = Config::parse("lr = 2\n", "t");
  EXPECT_DOUBLE_EQ(i.get_double("lr", 0), 2.0);
}

TEST(Config, OverridesAreTomlValuesOrBareStrings) {
  Config c;
  c.set_override("model.preset=gpt2-124m");
  c.set_override("data.paths=/tmp/a b.txt");
  c.set_override("train.steps = 12");
  c.set_override("train.name=\"quoted # not a comment\"");
  c.set_override("data.prefixes=[\"/p1\", \"/p2\"]");
  EXPECT_EQ(c.get_string("model.preset", ""), "gpt2-124m");
  EXPECT_EQ(c.get_string("data.paths", ""), "/tmp/a b.txt");
  EXPECT_EQ(c.get_int("train.steps", 0), 12);
  EXPECT_EQ(c.get_string("train.name", ""), "quoted # not a comment");
  EXPECT_EQ(c.get_string_list("data.prefixes", {}), (std::vector<std::string>{"/p1", "/p2"}));
  // Opened like a TOML string but not closed: an error, not a string with a quote in it.
  expect_contains(error_of([&] { c.set_override("train.name=\"abc"); }),
                  {"command line", "train.name"});
  EXPECT_THROW(c.set_override("bad key=1"), Error);
  EXPECT_THROW(c.set_override("train.steps="), Error);
}

TEST(Config, DumpReadsBackToTheSameValues) {
  Config c = Config::parse(
      "s = \"say \\\"hi\\\" \\\\ done\\n\"\nf = 3e-4\ng = 1.0\ni = -7\nb = false\n"
      "xs = ['a\"b', \"c\"]\n[t]\nu = { v = 0.1 }\n",
      "d.toml");
  c.set_override("p=/tmp/x");
  Config back = Config::parse(c.dump(), "dump");
  EXPECT_EQ(back.keys(), c.keys());
  EXPECT_EQ(back.get_string("s", ""), "say \"hi\" \\ done\n");
  EXPECT_EQ(back.get_double("f", 0), 3e-4);
  EXPECT_EQ(back.get_double("g", 0), 1.0);
  EXPECT_THROW(back.get_int("g", 0), Error);  // still a float, not an integer
  EXPECT_EQ(back.get_int("i", 0), -7);
  EXPECT_FALSE(back.get_bool("b", true));
  EXPECT_EQ(back.get_string_list("xs", {}), (std::vector<std::string>{"a\"b", "c"}));
  EXPECT_EQ(back.get_double("t.u.v", 0), 0.1);
  EXPECT_EQ(back.get_string("p", ""), "/tmp/x");
  EXPECT_EQ(back.dump(), c.dump());
}

TEST(Config, DumpEscapesEveryControlCharacter) {
  // Every control character, and DEL (which TOML forbids raw), as \u escapes in the source.
  std::string toml = "k = \"", want;
  for (int ch = 1; ch <= 0x7f; ch = ch == 0x1f ? 0x7f : ch + 1) {
    char u[8];
    std::snprintf(u, sizeof u, "\\u%04x", ch);
    toml += u;
    want += char(ch);
  }
  Config c = Config::parse(toml + "\"\n", "c.toml");
  ASSERT_EQ(c.get_string("k", ""), want);
  Config back = Config::parse(c.dump(), "dump");
  EXPECT_EQ(back.get_string("k", ""), want);
}

TEST(Config, Int32GetterRefusesWhatAnIntCannotHold) {
  // 4294967298 cast to int is 2: a model.n_layer past 32 bits must be an error, not 2 layers.
  Config c =
      Config::parse("[model]\nn_layer = 4294967298\nd_model = -2147483649\nvocab = 64\n", "m.toml");
  expect_contains(error_of([&] { get_int32(c, "model.n_layer", 2); }),
                  {"m.toml:2", "'model.n_layer' = 4294967298", "out of range"});
  expect_contains(error_of([&] { get_int32(c, "model.d_model", 2); }),
                  {"m.toml:3", "'model.d_model' = -2147483649"});
  EXPECT_EQ(get_int32(c, "model.vocab", 0), 64);
  expect_contains(error_of([&] { get_int32(c, "model.vocab", 0, 128, 1 << 20); }),
                  {"m.toml:4", "[128, 1048576]"});
}

TEST(Config, RangeCheckedGettersNameKeyBoundsAndWhereSet) {
  Config c = Config::parse("[train]\nsteps = 0\nlr = 2.5\nwarmup = 10\n", "r.toml");
  c.set_override("train.micro_batch=100000");
  expect_contains(error_of([&] { c.get_int("train.steps", 1, 1, 1000000); }),
                  {"r.toml:2", "'train.steps' = 0", "[1, 1000000]"});
  expect_contains(error_of([&] { c.get_double("train.lr", 0.1, 0, 1); }),
                  {"r.toml:3", "'train.lr' = 2.5", "out of range"});
  expect_contains(error_of([&] { c.get_int("train.micro_batch", 1, 1, 4096); }),
                  {"command line", "'train.micro_batch'"});
  EXPECT_EQ(c.get_int("train.warmup", 0, 0, 10), 10);   // bounds are inclusive
  EXPECT_EQ(c.get_int("train.absent", -5, 0, 10), -5);  // the default is the caller's
  EXPECT_EQ(c.where("train.warmup"), "r.toml:4");
  EXPECT_EQ(c.where("train.micro_batch"), "command line");
  EXPECT_EQ(c.where("train.absent"), "");
}
