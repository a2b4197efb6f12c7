//===- JsonTest.cpp - The runtime's JSON reader and writer ----------------===//

#include "vflow/Runtime/Json.h"
#include "vflow/Runtime/Error.h"

#include <gtest/gtest.h>

#include <cmath>

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

TEST(Json, NumbersAreTheShortestTextThatReadsBack) {
  auto text = [](Json v) { return v.dump(); };
  EXPECT_EQ(text(1.1), "1.1");
  EXPECT_EQ(text(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(text(1e-05), "1e-05");
  EXPECT_EQ(text(-2.5), "-2.5");
  EXPECT_EQ(text(1e300), "1e+300");
  EXPECT_EQ(text(double(float(0.1f))), "0.10000000149011612");
  // Integers of every type are written without a fraction.
  EXPECT_EQ(text(unsigned(7)), "7");
  EXPECT_EQ(text(size_t(1) << 40), "1099511627776");
  EXPECT_EQ(text(int64_t(-42)), "-42");
  EXPECT_EQ(text(3.0), "3");
  // Every double reads back exactly.
  for (double v : {1.1, 0.984375, 1.0 / 3, 6.02214076e23, 5e-324, 0.025286,
                   -123456.789e-10})
    EXPECT_EQ(Json::parse(text(v), "t").asNumber("v"), v) << text(v);
}

TEST(Json, NonFiniteNumbersAreNull) {
  Json arr = Json::array();
  arr.push(std::nan(""));
  arr.push(HUGE_VAL);
  arr.push(-HUGE_VAL);
  EXPECT_EQ(arr.dump(), "[null,null,null]");
}

TEST(Json, StringsAreValidUTF8WhateverTheyHold) {
  // Control characters are escaped; a byte that is not UTF-8 (Latin-1 e
  // acute, a lone continuation byte, an overlong slash) becomes U+FFFD;
  // valid multi-byte characters stay as they are.
  Json s(std::string("a\x01\x7f\t\"caf\xe9 \x80 \xc0\xaf \xc3\xa9"));
  EXPECT_EQ(s.dump(), "\"a\\u0001\\u007f\\t\\\"caf\\ufffd \\ufffd "
                      "\\ufffd\\ufffd \xc3\xa9\"");
  EXPECT_EQ(Json::parse(s.dump(), "t").asString("s"),
            "a\x01\x7f\t\"caf\xef\xbf\xbd \xef\xbf\xbd \xef\xbf\xbd\xef\xbf"
            "\xbd \xc3\xa9");
}

TEST(Json, ObjectsKeepTheirOrderAndReplaceInPlace) {
  Json obj = Json::object();
  obj.set("z", 1);
  obj.set("a", 2);
  obj.set("z", 3);
  EXPECT_EQ(obj.dump(), "{\"z\":3,\"a\":2}");
  EXPECT_EQ(Json::object().dump(), "{}");
  EXPECT_EQ(Json::array().dump(), "[]");
}

TEST(Json, BuildingChecksTheKind) {
  // A null becomes what is built into it; other kinds refuse.
  Json null;
  null.push(1);
  EXPECT_EQ(null.dump(), "[1]");
  Json other;
  other.set("a", true);
  EXPECT_EQ(other.dump(), "{\"a\":true}");
  Json text("x");
  EXPECT_THROW(text.push(1), Error);
  EXPECT_THROW(text.set("a", 1), Error);
  EXPECT_THROW(Json::array().set("a", 1), Error);
  EXPECT_TRUE(Json(1).members().empty());
}
