//===- ParserTest.cpp - Parsing .vflow into the AST -----------------------===//

#include "TestUtil.h"

#include <gtest/gtest.h>

using namespace vflow;
using namespace vflow::ast;

namespace {

std::unique_ptr<Module> parse(const std::string &text, DiagnosticEngine &diags,
                              SourceBuffer &buf) {
  diags.setBuffer(&buf);
  return parseSource(buf, diags);
}

} // namespace

TEST(Parser, DeclarationsAndRanges) {
  SourceBuffer buf("t", "flow f {\n  param budget = 64;\n  cache c = mean(K, "
                        "token);\n  index { return topk(x, budget); }\n}\n");
  DiagnosticEngine diags(&buf);
  auto module = parse(buf.getText(), diags, buf);
  ASSERT_TRUE(module) << diags.renderText();
  ASSERT_EQ(module->flows.size(), 1u);
  const Flow &flow = module->flows[0];
  EXPECT_EQ(flow.name.name, "f");
  ASSERT_EQ(flow.decls.size(), 3u);
  EXPECT_EQ(flow.decls[0].kind, DeclKind::Param);
  EXPECT_EQ(buf.getRangeText(flow.decls[0].name.range), "budget");
  EXPECT_EQ(flow.decls[1].kind, DeclKind::CacheField);
  EXPECT_EQ(buf.getRangeText(flow.decls[1].value->range), "mean(K, token)");
  EXPECT_EQ(flow.decls[2].kind, DeclKind::Index);
  ASSERT_EQ(flow.decls[2].body.size(), 1u);
  EXPECT_EQ(flow.decls[2].body[0].kind, StmtKind::Return);
}

TEST(Parser, PrecedenceAndAssociativity) {
  SourceBuffer buf("t", "flow f { index { let a = -x * y + z / w - v; let b = "
                        "not p < q and r or s; } }");
  DiagnosticEngine diags(&buf);
  auto module = parse(buf.getText(), diags, buf);
  ASSERT_TRUE(module) << diags.renderText();
  const auto &body = module->flows[0].decls[0].body;
  // ((-x * y) + (z / w)) - v
  auto *sub = dyn_cast<BinaryExpr>(body[0].value.get());
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->op, BinaryOp::Sub);
  auto *add = dyn_cast<BinaryExpr>(sub->lhs.get());
  ASSERT_TRUE(add);
  EXPECT_EQ(add->op, BinaryOp::Add);
  auto *mul = dyn_cast<BinaryExpr>(add->lhs.get());
  ASSERT_TRUE(mul);
  EXPECT_EQ(mul->op, BinaryOp::Mul);
  EXPECT_TRUE(isa<UnaryExpr>(mul->lhs.get()));
  // ((not (p < q)) and r) or s
  auto *orE = dyn_cast<BinaryExpr>(body[1].value.get());
  ASSERT_TRUE(orE);
  EXPECT_EQ(orE->op, BinaryOp::Or);
  auto *andE = dyn_cast<BinaryExpr>(orE->lhs.get());
  ASSERT_TRUE(andE);
  EXPECT_EQ(andE->op, BinaryOp::And);
  auto *notE = dyn_cast<UnaryExpr>(andE->lhs.get());
  ASSERT_TRUE(notE);
  EXPECT_EQ(notE->op, UnaryOp::Not);
  EXPECT_TRUE(isa<BinaryExpr>(notE->operand.get()));
}

TEST(Parser, CallArgumentForms) {
  SourceBuffer buf("t", "flow f { index { let a = g(x, m -> n, scale = 2, "
                        "[1, 2.5e-1], \"s\\\"q\"); } }");
  DiagnosticEngine diags(&buf);
  auto module = parse(buf.getText(), diags, buf);
  ASSERT_TRUE(module) << diags.renderText();
  auto *call =
      dyn_cast<CallExpr>(module->flows[0].decls[0].body[0].value.get());
  ASSERT_TRUE(call);
  ASSERT_EQ(call->args.size(), 5u);
  EXPECT_EQ(call->args[1].kind, CallArg::Kind::Rename);
  EXPECT_EQ(call->args[1].name, "m");
  EXPECT_EQ(call->args[1].to, "n");
  EXPECT_EQ(call->args[2].kind, CallArg::Kind::Named);
  auto *list = dyn_cast<ListExpr>(call->args[3].value.get());
  ASSERT_TRUE(list);
  auto *num = dyn_cast<NumberExpr>(list->elements[1].get());
  ASSERT_TRUE(num);
  EXPECT_DOUBLE_EQ(num->value, 0.25);
  EXPECT_FALSE(num->isInteger);
  auto *str = dyn_cast<StringExpr>(call->args[4].value.get());
  ASSERT_TRUE(str);
  EXPECT_EQ(str->value, "s\"q");
}

TEST(Parser, CommentsAreSkipped) {
  SourceBuffer buf("t", "// a\nflow /* b */ f { /* c\n d */ index { return "
                        "x; } } // e");
  DiagnosticEngine diags(&buf);
  EXPECT_TRUE(parse(buf.getText(), diags, buf)) << diags.renderText();
}

struct SyntaxCase {
  const char *text;
  const char *message;
  unsigned line, column;
};

class SyntaxErrors : public ::testing::TestWithParam<SyntaxCase> {};

TEST_P(SyntaxErrors, ReportMessageAndLocation) {
  const SyntaxCase &c = GetParam();
  SourceBuffer buf("t", c.text);
  DiagnosticEngine diags(&buf);
  EXPECT_FALSE(parse(buf.getText(), diags, buf));
  ASSERT_TRUE(diags.hasErrors());
  const Diagnostic &d = diags.getDiagnostics().front();
  EXPECT_EQ(d.message, c.message) << diags.renderText();
  LineCol lc = buf.getLineCol(d.range.begin);
  EXPECT_EQ(lc.line, c.line) << diags.renderText();
  EXPECT_EQ(lc.column, c.column) << diags.renderText();
}

INSTANTIATE_TEST_SUITE_P(
    Parser, SyntaxErrors,
    ::testing::Values(
        SyntaxCase{"flow f { param b = 1 }", "expected ';' after number 1", 1,
                   21},
        SyntaxCase{"flow f { index { return x } }", "expected ';' after 'x'", 1,
                   26},
        SyntaxCase{"flow { }", "expected a name after keyword 'flow'", 1, 5},
        SyntaxCase{"flow f { x = 1; }",
                   "expected a declaration (param, axis, const, cache, state "
                   "or index) or '}', found 'x'",
                   1, 10},
        SyntaxCase{"flow f { index { let = 3; } }",
                   "expected a name after keyword 'let'", 1, 21},
        SyntaxCase{"flow f { param a = 1 $ 2; }", "unexpected character '$'", 1,
                   22},
        SyntaxCase{"flow f { const s = load(\"x.npy); }",
                   "unterminated string literal", 1, 25},
        SyntaxCase{"flow f {\n /* never closed", "unterminated '/*' comment", 2,
                   2},
        SyntaxCase{"flow f { index { return x; }",
                   "unexpected end of file; expected a declaration (param, "
                   "axis, const, cache, state or index) or '}'",
                   1, 29},
        SyntaxCase{"flow f { param a = (1 + ; }",
                   "expected an expression, found ';'", 1, 25},
        SyntaxCase{"\x7f\x45\x4c\x46\x02\x01\x01",
                   "unexpected character '0x7f'", 1, 1}),
    [](const ::testing::TestParamInfo<SyntaxCase> &info) {
      return "Case" + std::to_string(info.index);
    });

TEST(Parser, RejectsBinaryAndBadUTF8) {
  {
    SourceBuffer buf("t", std::string("flow f {\0}", 10));
    DiagnosticEngine diags(&buf);
    EXPECT_FALSE(parse(buf.getText(), diags, buf));
    EXPECT_NE(diags.renderText().find("NUL byte"), std::string::npos);
  }
  {
    SourceBuffer buf("t", "flow f { // \xff\xfe\n }");
    DiagnosticEngine diags(&buf);
    EXPECT_FALSE(parse(buf.getText(), diags, buf));
    EXPECT_NE(diags.renderText().find("not valid UTF-8"), std::string::npos);
  }
}

TEST(Parser, NonASCIICommentsKeepByteColumns) {
  SourceBuffer buf("t", "// é ü\nflow f { param a = 1 $; }");
  DiagnosticEngine diags(&buf);
  EXPECT_FALSE(parse(buf.getText(), diags, buf));
  const Diagnostic &d = diags.getDiagnostics().front();
  EXPECT_EQ(buf.getRangeText(d.range), "$");
}

TEST(Parser, DeepNestingIsRejectedQuickly) {
  std::string text = "flow f { param a = " + std::string(100000, '(') + "1" +
                     std::string(100000, ')') + "; }";
  SourceBuffer buf("t", text);
  DiagnosticEngine diags(&buf);
  EXPECT_FALSE(parse(buf.getText(), diags, buf));
  EXPECT_NE(diags.renderText().find("nesting is too deep"), std::string::npos);
}

TEST(Parser, LongStatementsAreRejected) {
  std::string expr = "1";
  for (int i = 0; i < 5000; ++i)
    expr += " + 1";
  SourceBuffer buf("t", "flow f { param a = " + expr + "; }");
  DiagnosticEngine diags(&buf);
  EXPECT_FALSE(parse(buf.getText(), diags, buf));
  EXPECT_NE(diags.renderText().find("statement is too long"),
            std::string::npos);
}

TEST(Parser, JunkStopsAtTheErrorLimit) {
  std::string junk;
  for (int i = 0; i < 20000; ++i)
    junk += "} ) ; flow = [ ";
  SourceBuffer buf("t", junk);
  DiagnosticEngine diags(&buf);
  EXPECT_FALSE(parse(buf.getText(), diags, buf));
  EXPECT_LE(diags.getDiagnostics().size(), 20u);
}

TEST(Parser, IntegerLiteralsAreIntsUpTo2To53) {
  SourceBuffer ok("t", "flow f { index { let a = 9007199254740992; let b = "
                       "1e19; } }");
  DiagnosticEngine diags(&ok);
  auto module = parse(ok.getText(), diags, ok);
  ASSERT_TRUE(module) << diags.renderText();
  const auto &body = module->flows[0].decls[0].body;
  auto *a = dyn_cast<NumberExpr>(body[0].value.get());
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->isInteger);
  EXPECT_EQ(a->value, 9007199254740992.0);
  auto *b = dyn_cast<NumberExpr>(body[1].value.get());
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->isInteger);

  SourceBuffer bad("t", "flow f { index { let a = 9007199254740993; } }");
  DiagnosticEngine badDiags(&bad);
  EXPECT_FALSE(parse(bad.getText(), badDiags, bad));
  ASSERT_EQ(badDiags.getNumErrors(), 1u);
  const Diagnostic &d = badDiags.getDiagnostics()[0];
  EXPECT_EQ(bad.getRangeText(d.range), "9007199254740993");
  EXPECT_EQ(d.message.rfind("integer 9007199254740993 is out of range: an "
                            "int must be between -2^53 and 2^53",
                            0),
            0u)
      << d.message;
}

TEST(Parser, NamesAreAtMost64Characters) {
  std::string name64(64, 'n'), name65(65, 'n');
  SourceBuffer ok("t", "flow f { index { let " + name64 + " = 1; } }");
  DiagnosticEngine diags(&ok);
  EXPECT_TRUE(parse(ok.getText(), diags, ok)) << diags.renderText();
  SourceBuffer bad("t", "flow f { index { let " + name65 + " = 1; } }");
  DiagnosticEngine badDiags(&bad);
  EXPECT_FALSE(parse(bad.getText(), badDiags, bad));
  ASSERT_EQ(badDiags.getNumErrors(), 1u);
  EXPECT_EQ(badDiags.getDiagnostics()[0].message,
            "name is too long (65 characters; the limit is 64)");
}
