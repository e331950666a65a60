#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "core/json.h"
#include "core/utf8.h"

using namespace loom;

TEST(Json, ParsesAndDumpsRoundTrip) {
  Json j = Json::parse(R"({"a": [1, 2.5, "x\n\u00e9\ud83d\ude00"], "b": {"c": null, "d": true}})");
  EXPECT_EQ(j.at("a").as_array()[0].as_int(), 1);
  EXPECT_DOUBLE_EQ(j.at("a").as_array()[1].as_double(), 2.5);
  EXPECT_EQ(j.at("a").as_array()[2].as_string(), "x\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(j.at("b").at("c").is_null());
  EXPECT_TRUE(j.at("b").at("d").as_bool());
  Json again = Json::parse(j.dump());
  EXPECT_EQ(again.dump(), j.dump());
  EXPECT_EQ(Json::parse(j.dump(2)).dump(), j.dump());
}

TEST(Json, LargeIntegersStayExact) {
  Json j = Json::parse("[9007199254740993, -5]");
  EXPECT_EQ(j.as_array()[0].as_int(), 9007199254740993LL);
  EXPECT_EQ(j.as_array()[1].as_int(), -5);
}

TEST(Json, ErrorsNameLineAndColumn) {
  try {
    Json::parse("{\n  \"a\": tru\n}", "cfg.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json:2:8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Json::parse("[1, 2"), Error);
  EXPECT_THROW(Json::parse("{\"a\": 1} x"), Error);
  EXPECT_THROW(Json::parse("\"abc"), Error);
  EXPECT_THROW(Json::parse("{\"a\" 1}"), Error);
  EXPECT_THROW(Json::parse(""), Error);
}

TEST(Json, TypedAccessRejectsWrongTypes) {
  Json j = Json::parse(R"({"s": "x"})");
  EXPECT_THROW(j.at("s").as_int(), Error);
  EXPECT_THROW(j.at("missing"), Error);
}

// The writer and the string parser copy runs of plain bytes eight at a time: put the bytes that
// need work at every offset of a block, and at its ends.
TEST(Json, EscapesEveryByteAtEveryOffset) {
  for (int c = 0; c < 256; ++c) {
    std::string expect_escape;
    switch (c) {
      case '"':
        expect_escape = "\\\"";
        break;
      case '\\':
        expect_escape = "\\\\";
        break;
      case '\n':
        expect_escape = "\\n";
        break;
      case '\r':
        expect_escape = "\\r";
        break;
      case '\t':
        expect_escape = "\\t";
        break;
      case '\b':
        expect_escape = "\\b";
        break;
      case '\f':
        expect_escape = "\\f";
        break;
      default:
        if (c < 0x20) {
          const char* hex = "0123456789abcdef";
          expect_escape = std::string("\\u00") + hex[c >> 4] + hex[c & 15];
        } else if (c < 0x80) {
          expect_escape = std::string(1, static_cast<char>(c));  // DEL as it is
        } else {
          expect_escape = "\xEF\xBF\xBD";  // a lone byte >= 0x80 is no character: U+FFFD
        }
    }
    for (size_t before = 0; before < 18; ++before) {
      std::string s =
          std::string(before, 'a') + static_cast<char>(c) + std::string(17 - before, 'b');
      std::string out = "x";
      json_escape(out, s);
      ASSERT_EQ(out, "x\"" + std::string(before, 'a') + expect_escape +
                         std::string(17 - before, 'b') + "\"")
          << "byte " << c << " after " << before;
      // Every byte reads back as itself, the replaced ones as U+FFFD.
      ASSERT_EQ(Json::parse(out.substr(1)).as_string(),
                std::string(before, 'a') + (c < 0x80 ? std::string(1, char(c)) : expect_escape) +
                    std::string(17 - before, 'b'))
          << "byte " << c << " after " << before;
      // The parser takes raw bytes as they are (strings hold bytes).
      ASSERT_EQ(Json::parse(
                    "\"" + std::string(1, char(c == '"' || c == '\\' || c < 0x20 ? 'q' : c)) + "\"")
                    .as_string(),
                std::string(1, char(c == '"' || c == '\\' || c < 0x20 ? 'q' : c)));
    }
  }
  std::string out;
  json_escape(out, "");
  EXPECT_EQ(out, "\"\"");
}

// Well-formed UTF-8 of every length is copied at every offset of a block; ill-formed bytes
// become U+FFFD, one per maximal ill-formed prefix (Unicode's Table 3-8 and Python's
// bytes.decode(errors="replace") give the same), so dump() is valid UTF-8 for any bytes.
TEST(Json, WritesOnlyValidUtf8) {
  const std::string chars[] = {"\xC3\xA9", "\xE6\xBC\xA2", "\xF0\x9F\x98\x80", "\xF4\x8F\xBF\xBF"};
  for (const std::string& ch : chars)
    for (size_t before = 0; before < 12; ++before) {
      const std::string s = std::string(before, 'a') + ch + "bbbbbbbbbb";
      std::string out;
      json_escape(out, s);
      ASSERT_EQ(out, "\"" + s + "\"") << before;
    }
  const std::pair<std::string, std::string> cases[] = {
      {"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64",
       "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd"},        // Unicode's own example
      {"\xED\xA0\x80x", "\uFFFD\uFFFD\uFFFDx"},            // a surrogate
      {"\xE0\x80\xAFy", "\uFFFD\uFFFD\uFFFDy"},            // overlong
      {"\xF4\x90\x80\x80z", "\uFFFD\uFFFD\uFFFD\uFFFDz"},  // past U+10FFFF
      {"\xC0\xAFw", "\uFFFD\uFFFDw"},
      {"\xFF\xFE", "\uFFFD\uFFFD"},
      {"\xE6\xBC", "\uFFFD"},  // a character cut at the end of the string
      {"\xF0\x9F\x98\\", "\uFFFD\\\\"},
  };
  for (auto& [in, want] : cases) {
    std::string out;
    json_escape(out, in);
    EXPECT_EQ(Json::parse(out).as_string(), Json::parse("\"" + want + "\"").as_string()) << want;
    EXPECT_EQ(utf8_lossy(in), Json::parse(out).as_string()) << want;
  }
}

// ASCII output (Python's json.dumps(ensure_ascii=True), Jinja's tojson): everything outside
// 0x20-0x7E escaped, DEL included, surrogate pairs above U+FFFF, U+FFFD for ill-formed bytes;
// at every offset of the eight-byte scan, so the vector and scalar paths both see each case.
TEST(Json, EnsureAsciiEscapesAsPythonDoes) {
  const std::pair<std::string, std::string> cases[] = {
      {"plain text", "plain text"},
      {"\x7F", "\\u007f"},
      {"\x01\n\"\\", "\\u0001\\n\\\"\\\\"},
      {"\xC3\xA9", "\\u00e9"},
      {"\xE6\xBC\xA2", "\\u6f22"},
      {"\xF0\x9F\x8E\x89", "\\ud83c\\udf89"},
      {"\xF4\x8F\xBF\xBF", "\\udbff\\udfff"},
      {"\xFF", "\\ufffd"},
  };
  for (auto& [in, want] : cases)
    for (size_t before = 0; before < 10; ++before) {
      const std::string pad(before, 'a');
      std::string out;
      json_escape(out, pad + in + "bbbbbbbb", true);
      ASSERT_EQ(out, "\"" + pad + want + "bbbbbbbb\"") << before << " " << want;
    }
  std::string keep;
  json_escape(keep, "\x7F\xC3\xA9");
  EXPECT_EQ(keep, "\"\x7F\xC3\xA9\"");  // without it DEL and UTF-8 are copied
}

TEST(Json, FindsTheIncompleteCharacterAtTheEnd) {
  EXPECT_EQ(utf8_incomplete_tail(""), 0u);
  EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE6"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE6\xBC"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE6\xBC\xA2"), 0u);  // complete
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("a\xFF"), 0u);      // never a character: nothing to wait for
  EXPECT_EQ(utf8_incomplete_tail("a\xE0\x80"), 0u);  // overlong already
  EXPECT_EQ(utf8_incomplete_tail("a\x80"), 0u);      // a stray continuation byte
}

TEST(Json, ParsesEscapesAtEveryOffset) {
  const std::pair<const char*, const char*> escapes[] = {
      {"\\\"", "\""},
      {"\\\\", "\\"},
      {"\\/", "/"},
      {"\\n\\t", "\n\t"},
      {"\\u00e9", "\xC3\xA9"},
      {"\\ud83d\\ude00", "\xF0\x9F\x98\x80"},  // surrogate pair
      {"\\ud83dx", "\xEF\xBF\xBDx"},           // lone high surrogate
      {"\\ude00", "\xEF\xBF\xBD"},             // lone low surrogate
  };
  for (auto [escaped, text] : escapes) {
    for (size_t before = 0; before < 18; ++before) {
      std::string head(before, 'a'), tail(17 - before, 'b');
      Json j = Json::parse("\"" + head + escaped + tail + "\"");
      ASSERT_EQ(j.as_string(), head + text + tail) << escaped << " after " << before;
    }
  }
  EXPECT_THROW(Json::parse(R"("abc\ud83d\u0041")"), Error);  // high surrogate, no low one
  EXPECT_THROW(Json::parse(R"("abcdefghij\u12")"), Error);
  EXPECT_THROW(Json::parse(R"("abcdefghij\x")"), Error);
  EXPECT_THROW(Json::parse("\"abcdefghij\\"), Error);
}

TEST(Json, StringErrorsPointAtTheByte) {
  auto message = [](const std::string& text) {
    try {
      Json::parse(text, "t");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // The column is the one after the offending byte, as the parser reads it.
  EXPECT_NE(message("[\"abcdefghijklmnop\x01q\"]").find("t:1:20: control character"),
            std::string::npos)
      << message("[\"abcdefghijklmnop\x01q\"]");
  // A raw newline is already counted as the next line.
  EXPECT_NE(message("\"abc\ndefghijklmnop\"").find("t:2:1: control character"), std::string::npos);
  EXPECT_NE(message("[1,\n\"abcdefghijklmnopqrs").find("t:2:21: unterminated string"),
            std::string::npos)
      << message("[1,\n\"abcdefghijklmnopqrs");
  // Duplicate keys: the last one wins.
  EXPECT_EQ(Json::parse(R"({"a": 1, "a": 2})").at("a").as_int(), 2);
}

static std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Json, AsIntRejectsFloatsItCannotHoldNamingTheValue) {
  // Each of these was once cast to int64 (undefined behaviour for the out-of-range ones).
  Json j = Json::parse("[1e300, -1e19, 9.3e18, 2.5, 3.0, -9.2e18]");
  auto& a = j.as_array();
  std::string e = error_of([&] { a[0].as_int(); });
  EXPECT_NE(e.find("expected integer"), std::string::npos) << e;
  EXPECT_NE(e.find("1e+300"), std::string::npos) << e;
  EXPECT_THROW(a[1].as_int(), Error);
  EXPECT_THROW(a[2].as_int(), Error);
  e = error_of([&] { a[3].as_int(); });
  EXPECT_NE(e.find("2.5"), std::string::npos) << e;
  EXPECT_EQ(a[4].as_int(), 3);
  EXPECT_EQ(a[5].as_int(), -9200000000000000000LL);
}

TEST(Json, NumbersPastDoubleRangeAreParseErrors) {
  std::string e = error_of([] { Json::parse("[1E400]", "ids.json"); });
  EXPECT_NE(e.find("ids.json"), std::string::npos) << e;
  EXPECT_NE(e.find("1E400"), std::string::npos) << e;
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  EXPECT_THROW(Json::parse("-1e999"), Error);
  // Past int64 but inside double: a float, not a truncated integer.
  Json big = Json::parse("18446744073709551616");
  EXPECT_EQ(big.type(), Json::Type::Float);
  EXPECT_THROW(big.as_int(), Error);
}

TEST(Json, RangedAccessorsNameValueAndRange) {
  Json j = Json::parse("[4294967297, -1, 7]");
  auto& a = j.as_array();
  std::string e = error_of([&] { a[0].as_int32(); });
  EXPECT_NE(e.find("4294967297"), std::string::npos) << e;
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  EXPECT_THROW(a[1].as_int(0, 10), Error);
  EXPECT_EQ(a[2].as_int(0, 10), 7);
  EXPECT_EQ(a[2].as_int32(), 7);
}

// One document's nesting is bounded, the limit named: parsing recurses once per level, so
// 100,000 nested arrays would otherwise overflow the stack.
TEST(Json, NestingPastTheBoundIsAnErrorNamingIt) {
  auto nested = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_NO_THROW(Json::parse(nested(512)));
  for (int n : {513, 100000}) {
    std::string e;
    try {
      Json::parse(nested(n), "deep.json");
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_NE(e.find("deep.json:1:"), std::string::npos) << e;
    EXPECT_NE(e.find("deeper than 512 levels (too_deep)"), std::string::npos) << e;
  }
}
