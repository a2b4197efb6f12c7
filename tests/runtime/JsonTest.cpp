//===- JsonTest.cpp - The runtime's JSON reader and writer ----------------===//

#include "vflow/Runtime/Json.h"
#include "vflow/Runtime/Error.h"

#include <gtest/gtest.h>

using namespace vflow::rt;

TEST(Json, RoundTripsEveryKind) {
  Json obj = Json::object();
  obj.set("s", "a\"b\\c\n\x01");
  obj.set("n", 1.5);
  obj.set("i", int64_t(-42));
  obj.set("t", true);
  obj.set("z", Json());
  Json arr = Json::array();
  arr.push(1);
  arr.push("x");
  obj.set("a", std::move(arr));
  std::string text = obj.dump();
  Json back = Json::parse(text, "test");
  EXPECT_EQ(back.dump(), text);
  EXPECT_EQ(back.at("s", "o").asString("s"), "a\"b\\c\n\x01");
  EXPECT_EQ(back.at("i", "o").asInt("i"), -42);
  EXPECT_TRUE(back.at("z", "o").isNull());
  EXPECT_EQ(back.at("a", "o").asArray("a").size(), 2u);
}

TEST(Json, UnicodeEscapesBecomeUTF8) {
  Json v = Json::parse("\"caf\\u00e9\"", "t");
  EXPECT_EQ(v.asString("v"), "caf\xc3\xa9");
}

TEST(Json, ErrorsSayWhereAndWhy) {
  auto message = [](const std::string &text) {
    try {
      Json::parse(text, "m.json");
    } catch (const Error &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("{\"a\": }"),
            "m.json: invalid JSON at byte 6: unexpected character '}'");
  EXPECT_EQ(message("[1, 2"), "m.json: invalid JSON at byte 5: expected ',' "
                              "or ']'");
  EXPECT_EQ(message("\"abc"),
            "m.json: invalid JSON at byte 4: unterminated string");
  EXPECT_EQ(message("1 2"),
            "m.json: invalid JSON at byte 2: unexpected text after the "
            "document");
  EXPECT_NE(message(std::string(1000, '[')).find("nesting is too deep"),
            std::string::npos);
  Json obj = Json::parse("{\"a\": 1}", "t");
  EXPECT_THROW(obj.at("b", "thing"), Error);
  EXPECT_THROW(obj.at("a", "thing").asString("thing.a"), Error);
}
