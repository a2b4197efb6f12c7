//===- DiagnosticsTest.cpp - Source buffers and diagnostic rendering ------===//

#include "vflow/Frontend/Diagnostics.h"

#include <gtest/gtest.h>

using namespace vflow;

TEST(SourceBuffer, LineAndColumn) {
  SourceBuffer buf("f.vflow", "ab\ncde\n\nf");
  EXPECT_EQ(buf.getLineCol(0).line, 1u);
  EXPECT_EQ(buf.getLineCol(0).column, 1u);
  EXPECT_EQ(buf.getLineCol(4).line, 2u);
  EXPECT_EQ(buf.getLineCol(4).column, 2u);
  EXPECT_EQ(buf.getLineCol(8).line, 4u);
  EXPECT_EQ(buf.getLineText(2), "cde");
  EXPECT_EQ(buf.getLineText(3), "");
  EXPECT_EQ(buf.getRangeText(SourceRange(3, 6)), "cde");
}

TEST(Diagnostics, TextHasLocationLineAndCaret) {
  SourceBuffer buf("f.vflow", "let x = kmx + 1;\n");
  DiagnosticEngine diags(&buf);
  diags.error(SourceRange(8, 11), "unknown name 'kmx'");
  diags.note(SourceRange(), "did you mean 'kmax'?");
  std::string text = diags.renderText();
  EXPECT_EQ(text, "f.vflow:1:9: error: unknown name 'kmx'\n"
                  "  let x = kmx + 1;\n"
                  "          ^~~\n"
                  "f.vflow: note: did you mean 'kmax'?\n");
}

TEST(Diagnostics, JSONIsEscapedAndComplete) {
  SourceBuffer buf("a\"b.vflow", "x\ty\n");
  DiagnosticEngine diags(&buf);
  diags.error(SourceRange(2, 3), "bad \"y\"");
  std::string json = diags.renderJSON();
  EXPECT_NE(json.find("\"file\":\"a\\\"b.vflow\""), std::string::npos);
  EXPECT_NE(json.find("\"line\":1,\"column\":3"), std::string::npos);
  EXPECT_NE(json.find("\"message\":\"bad \\\"y\\\"\""), std::string::npos);
  EXPECT_NE(json.find("\"source_line\":\"x\\ty\""), std::string::npos);
  EXPECT_NE(json.find("\"errors\":1"), std::string::npos);
}

TEST(Diagnostics, ErrorLimitDropsTheRest) {
  SourceBuffer buf("f", "x");
  DiagnosticEngine diags(&buf, 3);
  for (int i = 0; i < 10; ++i)
    diags.error(SourceRange(0, 1), "e" + std::to_string(i));
  EXPECT_EQ(diags.getNumErrors(), 10u);
  EXPECT_EQ(diags.getDiagnostics().size(), 3u);
  EXPECT_NE(diags.renderText().find("7 more errors not shown"),
            std::string::npos);
}

TEST(Diagnostics, LongLinesShowAWindowAroundTheCaret) {
  std::string line(500, 'a');
  line[400] = 'X';
  SourceBuffer buf("f", line);
  DiagnosticEngine diags(&buf);
  diags.error(SourceRange(400, 401), "here");
  std::string text = diags.renderText();
  size_t src = text.find('\n') + 1;
  size_t caretLine = text.find('\n', src) + 1;
  std::string shown = text.substr(src, caretLine - src);
  std::string caret = text.substr(caretLine);
  EXPECT_LT(shown.size(), 200u);
  EXPECT_EQ(shown[caret.find('^')], 'X');
}

TEST(ClosestName, FindsTyposOnly) {
  EXPECT_EQ(closestName("kmx", {"kmax", "kmin", "q"}).value_or(""), "kmax");
  EXPECT_FALSE(closestName("zzzz", {"kmax", "kmin"}).has_value());
}
