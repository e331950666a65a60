#include <gtest/gtest.h>

#include "core/error.h"
#include "core/json.h"

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
