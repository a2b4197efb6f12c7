//===- DiagnosticsTest.cpp - Source buffers and diagnostic rendering ------===//

#include "vflow/Frontend/Diagnostics.h"

#include <set>

#include <gtest/gtest.h>

#include <cstdio>
#include <unistd.h>

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
  diags.error(DiagCode::UnknownName, SourceRange(8, 11), "unknown name 'kmx'");
  diags.note(SourceRange(), "did you mean 'kmax'?");
  std::string text = diags.renderText();
  EXPECT_EQ(text, "f.vflow:1:9: error: unknown name 'kmx' [E200]\n"
                  "  let x = kmx + 1;\n"
                  "          ^~~\n"
                  "f.vflow: note: did you mean 'kmax'?\n");
}

TEST(Diagnostics, JSONIsEscapedAndComplete) {
  SourceBuffer buf("a\"b.vflow", "x\ty\n");
  DiagnosticEngine diags(&buf);
  diags.error(DiagCode::UnknownName, SourceRange(2, 3), "bad \"y\"");
  std::string json = diags.renderJSON();
  EXPECT_NE(json.find("\"file\":\"a\\\"b.vflow\""), std::string::npos);
  EXPECT_NE(json.find("\"line\":1,\"column\":3"), std::string::npos);
  EXPECT_NE(json.find("\"message\":\"bad \\\"y\\\"\""), std::string::npos);
  EXPECT_NE(json.find("\"source_line\":\"x\\ty\""), std::string::npos);
  EXPECT_NE(json.find("\"errors\":1"), std::string::npos);
}

TEST(Diagnostics, JSONHasEveryMemberInTheDocumentedOrder) {
  // docs/json.md, Diagnostics: a located error with a located note and a
  // note without a location, then a warning without a location.
  SourceBuffer buf("f.vflow", "let x = kmx + 1;\nlet kmax = 2;\n");
  DiagnosticEngine diags(&buf);
  diags.error(DiagCode::UnknownName, SourceRange(8, 11), "unknown name 'kmx'");
  diags.hint(SourceRange(21, 25), "did you mean 'kmax'?");
  diags.note(SourceRange(), "no location");
  diags.warning(DiagCode::UnreadField, SourceRange(), "-p: unused");
  EXPECT_EQ(diags.renderJSON(),
            "{\"file\":\"f.vflow\",\"errors\":1,\"truncated\":false,"
            "\"warnings\":1,\"diagnostics\":["
            "{\"severity\":\"error\",\"code\":\"E200\",\"line\":1,"
            "\"column\":9,\"end_line\":1,"
            "\"end_column\":12,\"message\":\"unknown name 'kmx'\","
            "\"source_line\":\"let x = kmx + 1;\",\"notes\":["
            "{\"line\":2,\"column\":5,\"end_line\":2,\"end_column\":9,"
            "\"message\":\"did you mean 'kmax'?\",\"hint\":true},"
            "{\"line\":null,\"column\":null,\"message\":\"no location\","
            "\"hint\":false}]},"
            "{\"severity\":\"warning\",\"code\":\"W901\",\"line\":null,"
            "\"column\":null,"
            "\"message\":\"-p: unused\",\"notes\":[]}]}");
  // Without a buffer (the tool's own errors) the file is null.
  DiagnosticEngine tool;
  EXPECT_EQ(tool.renderJSON(),
            "{\"file\":null,\"errors\":0,\"truncated\":false,\"warnings\":0,"
            "\"diagnostics\":[]}");
}

TEST(Diagnostics, CodesAreUniqueAndRoundTrip) {
  std::set<std::string> seen;
  for (DiagCode c : allDiagCodes()) {
    std::string name = diagCodeName(c);
    EXPECT_TRUE(seen.insert(name).second) << name << " is used twice";
    ASSERT_EQ(name.size(), 4u) << name;
    EXPECT_TRUE(name[0] == 'E' || name[0] == 'W') << name;
    EXPECT_EQ(diagCodeFromName(name), c);
    EXPECT_GT(std::string(diagCodeSummary(c)).size(), 10u);
  }
  EXPECT_FALSE(diagCodeFromName("E000").has_value());
  // Codes are stable: a few that tools match on.
  EXPECT_STREQ(diagCodeName(DiagCode::Syntax), "E101");
  EXPECT_STREQ(diagCodeName(DiagCode::UnknownName), "E200");
  EXPECT_STREQ(diagCodeName(DiagCode::BudgetOnDevice), "E600");
  EXPECT_STREQ(diagCodeName(DiagCode::Internal), "E999");
}

TEST(Diagnostics, JSONSaysWhenErrorsWereDropped) {
  SourceBuffer buf("f", "x");
  DiagnosticEngine diags(&buf, 3);
  for (int i = 0; i < 5; ++i)
    diags.error(DiagCode::UnknownName, SourceRange(0, 1), "e");
  rt::Json json = diags.toJSON();
  EXPECT_EQ(json.at("errors", "d").asInt("errors"), 5);
  EXPECT_TRUE(json.at("truncated", "d").asBool("truncated"));
  EXPECT_EQ(json.at("diagnostics", "d").asArray("diagnostics").size(), 3u);
}

TEST(Diagnostics, UnreadableFilesAreEntriesLikeAnyOther) {
  // The entry of vflowc's document and of CompileResult::diagnosticsJSON
  // for a file that cannot be read; a name that is not UTF-8 stays valid.
  EXPECT_EQ(unreadableFileJSON("caf\xe9.vflow", "no such file").dump(),
            "{\"file\":\"caf\\ufffd.vflow\",\"errors\":1,\"truncated\":false,"
            "\"warnings\":0,\"diagnostics\":[{\"severity\":\"error\","
            "\"code\":\"E100\",\"line\":null,\"column\":null,\"message\":\"no "
            "such file\","
            "\"notes\":[]}]}");
}

TEST(Diagnostics, ErrorLimitDropsTheRest) {
  SourceBuffer buf("f", "x");
  DiagnosticEngine diags(&buf, 3);
  for (int i = 0; i < 10; ++i)
    diags.error(DiagCode::UnknownName, SourceRange(0, 1),
                "e" + std::to_string(i));
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
  diags.error(DiagCode::UnknownName, SourceRange(400, 401), "here");
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

namespace {

/// The source line and caret line of the first diagnostic of a rendering.
std::pair<std::string, std::string> shownLines(const std::string &text) {
  size_t src = text.find('\n') + 1;
  size_t caret = text.find('\n', src) + 1;
  size_t end = text.find('\n', caret);
  return {text.substr(src, caret - 1 - src), text.substr(caret, end - caret)};
}

} // namespace

TEST(Diagnostics, LongLinesAreCutInTextAndJSON) {
  // A 700 KB line: every diagnostic used to repeat all of it.
  std::string line(700000, 'a');
  line.replace(500000, 3, "zzz");
  SourceBuffer buf("f", line);
  DiagnosticEngine diags(&buf);
  for (int i = 0; i < 20; ++i)
    diags.error(DiagCode::UnknownName, SourceRange(500000, 500003), "here");
  std::string text = diags.renderText();
  std::string json = diags.renderJSON();
  EXPECT_LT(text.size(), 20u * 400u);
  EXPECT_LT(json.size(), 20u * 400u);

  auto [shown, caret] = shownLines(text);
  EXPECT_EQ(shown.substr(0, 5), "  ...");
  EXPECT_EQ(shown.substr(shown.size() - 3), "...");
  EXPECT_LE(shown.size(), 2 + 3 + kMaxExcerptBytes + 3);
  size_t at = caret.find('^');
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(shown.substr(at, 3), "zzz");
  EXPECT_EQ(caret.substr(at), "^~~");

  // JSON: the excerpt and where it starts in the line, so that columns map
  // into it.
  size_t offsetAt = json.find("\"source_line_offset\":");
  ASSERT_NE(offsetAt, std::string::npos);
  size_t offset = std::stoul(json.substr(offsetAt + 21));
  size_t lineAt = json.find("\"source_line\":\"") + 15;
  std::string excerpt = json.substr(lineAt, json.find('"', lineAt) - lineAt);
  EXPECT_LE(excerpt.size(), kMaxExcerptBytes);
  // column 500001 (1-based) is byte 500000 of the line.
  EXPECT_EQ(excerpt.substr(500000 - offset, 3), "zzz");
  EXPECT_NE(json.find("\"column\":500001"), std::string::npos);
}

TEST(Diagnostics, ShortLinesAreNotCutAndHaveNoOffset) {
  SourceBuffer buf("f", "let x = kmx + 1;\n");
  DiagnosticEngine diags(&buf);
  diags.error(DiagCode::UnknownName, SourceRange(8, 11), "unknown name 'kmx'");
  EXPECT_EQ(diags.renderJSON().find("source_line_offset"), std::string::npos);
  EXPECT_NE(diags.renderJSON().find("\"source_line\":\"let x = kmx + 1;\""),
            std::string::npos);
}

TEST(Diagnostics, WindowsCutBetweenUTF8Characters) {
  // Two-byte characters everywhere: a cut inside one would show a broken
  // character; the caret must still sit under the error.
  std::string line;
  for (int i = 0; i < 400; ++i)
    line += "\xc3\xa9"; // e acute
  line += "XY";
  for (int i = 0; i < 400; ++i)
    line += "\xc3\xa9";
  SourceBuffer buf("f", line);
  DiagnosticEngine diags(&buf);
  diags.error(DiagCode::UnknownName, SourceRange(800, 802), "here");
  LineExcerpt e = excerptLine(line, 800);
  EXPECT_TRUE(e.cut);
  EXPECT_EQ(e.offset % 2, 0u);
  EXPECT_EQ(e.text.size() % 2, 0u);
  EXPECT_LE(e.text.size(), kMaxExcerptBytes);
  auto [shown, caret] = shownLines(diags.renderText());
  // Characters, not bytes, before the caret.
  size_t col = caret.find('^');
  size_t chars = 0, i = 0;
  for (; i < shown.size() && chars < col; ++chars)
    i += (static_cast<unsigned char>(shown[i]) >= 0xc0) ? 2 : 1;
  EXPECT_EQ(shown.substr(i, 2), "XY");
  EXPECT_EQ(caret.substr(col), "^~");
}

TEST(ReadFileText, ReportsTheSystemsReason) {
  char pattern[] = "/tmp/vflow-read-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  std::string dir = pattern;
  std::string a = dir + "/a.vflow", b = dir + "/b.vflow";
  ASSERT_EQ(symlink(b.c_str(), a.c_str()), 0);
  ASSERT_EQ(symlink(a.c_str(), b.c_str()), 0);
  std::string text, error;
  EXPECT_FALSE(readFileText(a, 1 << 20, text, error));
  EXPECT_EQ(error,
            "cannot open '" + a + "': too many levels of symbolic links");
  EXPECT_FALSE(readFileText(dir + "/none.vflow", 1 << 20, text, error));
  EXPECT_EQ(error, "no such file '" + dir + "/none.vflow'");
  EXPECT_FALSE(readFileText(dir, 1 << 20, text, error));
  EXPECT_EQ(error, "'" + dir + "' is a directory");
  std::remove(a.c_str());
  std::remove(b.c_str());
  rmdir(dir.c_str());
}
