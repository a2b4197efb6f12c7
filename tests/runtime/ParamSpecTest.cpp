//===- ParamSpecTest.cpp - The NAME=VALUE syntax and path checks ---------===//
//
// splitParamSpec and parseParamValue (Params.h): the one syntax of a param
// override that vflowc -p and the vflow CLI's -p share; checkPathText
// (Files.h): a path with a NUL byte never reaches the file system.
//
//===----------------------------------------------------------------------===//

#include "TestUtil.h"

#include "vflow/Runtime/Files.h"
#include "vflow/Runtime/Params.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>

#include <unistd.h>

using namespace vflow::rt;
using vflow::rt::test::expectError;

namespace {

std::pair<std::string, std::string> split(const std::string &text) {
  std::string name, value, why;
  EXPECT_TRUE(splitParamSpec(text, name, value, why)) << text << ": " << why;
  return {name, value};
}

TEST(ParamSpec, BlanksAroundNameAndValueAreIgnoredAlike) {
  using P = std::pair<std::string, std::string>;
  // "budget= 2" and "budget=2 " are the same override (the first used to
  // be accepted by strtod and the second refused).
  EXPECT_EQ(split("budget= 2"), P("budget", "2"));
  EXPECT_EQ(split("budget=2 "), P("budget", "2"));
  EXPECT_EQ(split(" budget =\t2\n"), P("budget", "2"));
  EXPECT_EQ(split("quest.budget=8, 16"), P("quest.budget", "8, 16"));
  // The first '=' splits; the rest is the value (the compiler refuses it).
  EXPECT_EQ(split("a=b=c"), P("a", "b=c"));
  // Empty parts are the compiler's to report (with its hint).
  EXPECT_EQ(split("=4"), P("", "4"));
  EXPECT_EQ(split("budget= "), P("budget", ""));
  std::string name, value, why;
  EXPECT_FALSE(splitParamSpec("budget", name, value, why));
  EXPECT_NE(why.find("expected NAME=VALUE"), std::string::npos) << why;
}

ParamValue value(const std::string &text) {
  ParamValue v;
  std::string why;
  EXPECT_TRUE(parseParamValue(text, v, why)) << text << ": " << why;
  return v;
}

std::string refusal(const std::string &text) {
  ParamValue v;
  std::string why;
  EXPECT_FALSE(parseParamValue(text, v, why)) << text;
  return why;
}

TEST(ParamSpec, ValuesAreBoolsIntsOrFiniteDecimals) {
  EXPECT_EQ(value("true").kind, ParamValue::Kind::Bool);
  EXPECT_EQ(value(" false ").value, 0);
  EXPECT_EQ(value("32").kind, ParamValue::Kind::Int);
  EXPECT_EQ(value(" -7").value, -7);
  EXPECT_EQ(value("+9007199254740992").value, 9007199254740992.0);
  // Beyond 2^53 an integer is a float (an int param refuses it).
  EXPECT_EQ(value("9007199254740993").kind, ParamValue::Kind::Float);
  EXPECT_EQ(value("0.5").kind, ParamValue::Kind::Float);
  EXPECT_EQ(value("1e3").value, 1000);
  EXPECT_EQ(value("-.25").value, -0.25);
  for (const char *bad : {"", " ", "x", "True", "0x10", "1p3", "inf", "-inf",
                          "nan", "infinity", "1_000", "2 3", "1e", "--1"})
    EXPECT_NE(refusal(bad).find("is not a number, true or false"),
              std::string::npos)
        << bad;
  EXPECT_NE(refusal("1e999").find("out of range"), std::string::npos);
}

TEST(Files, PathsWithANulByteAreRefused) {
  expectError([] { checkPathText(std::string("a\0b.vfa", 7), "artifact"); },
              "artifact: the path 'a\\0b.vfa' holds a NUL byte at offset 1");
  expectError([] { checkPathText("", "model path"); },
              "model path: the path is empty");
  checkPathText("/tmp/ok.vfa", "artifact");
  // writeFileAtomically never writes the file named by the part before the
  // NUL.
  char dir[] = "/tmp/vflow-nul-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string cut = std::string(dir) + "/out";
  expectError([&] { writeFileAtomically(cut + std::string("\0.vfa", 5), "x"); },
              "holds a NUL byte");
  EXPECT_NE(access(cut.c_str(), F_OK), 0);
  rmdir(dir);
}

} // namespace
