//===- ParserTest.cpp - Parsing .vflow into the AST -----------------------===//

#include "TestUtil.h"

#include <gtest/gtest.h>

using namespace vflow;
using namespace vflow::ast;

namespace {

/// Parses `text` (file "t"); keeps the buffer and the diagnostics alive for
/// inspection. `module` is null when parsing failed.
struct Parsed {
  SourceBuffer buf;
  DiagnosticEngine diags;
  std::unique_ptr<Module> module;

  explicit Parsed(std::string text)
      : buf("t", std::move(text)), diags(&buf),
        module(parseSource(buf, diags)) {}

  /// The statements of the first declaration of the first flow.
  const std::vector<Stmt> &firstBody() const {
    return module->flows[0].decls[0].body;
  }
  /// The rendered diagnostics contain `text`.
  bool mentions(const std::string &text) const {
    return diags.renderText().find(text) != std::string::npos;
  }
};

/// `e` as a binary expression (null if it is not one); its operator is `op`.
const BinaryExpr *binary(const Expr *e, BinaryOp op) {
  auto *b = dyn_cast<BinaryExpr>(e);
  if (b) {
    EXPECT_EQ(b->op, op);
  }
  return b;
}

} // namespace

TEST(Parser, DeclarationsAndRanges) {
  Parsed p("flow f {\n  param budget = 64;\n  cache c = mean(K, token);\n  "
           "index { return topk(x, budget); }\n}\n");
  ASSERT_TRUE(p.module) << p.diags.renderText();
  ASSERT_EQ(p.module->flows.size(), 1u);
  const Flow &flow = p.module->flows[0];
  EXPECT_EQ(flow.name.name, "f");
  ASSERT_EQ(flow.decls.size(), 3u);
  EXPECT_EQ(flow.decls[0].kind, DeclKind::Param);
  EXPECT_EQ(p.buf.getRangeText(flow.decls[0].name.range), "budget");
  EXPECT_EQ(flow.decls[1].kind, DeclKind::CacheField);
  EXPECT_EQ(p.buf.getRangeText(flow.decls[1].value->range), "mean(K, token)");
  EXPECT_EQ(flow.decls[2].kind, DeclKind::Index);
  ASSERT_EQ(flow.decls[2].body.size(), 1u);
  EXPECT_EQ(flow.decls[2].body[0].kind, StmtKind::Return);
}

TEST(Parser, PrecedenceAndAssociativity) {
  Parsed p("flow f { index { let a = -x * y + z / w - v; let b = not p < q "
           "and r or s; } }");
  ASSERT_TRUE(p.module) << p.diags.renderText();
  const auto &body = p.firstBody();
  // ((-x * y) + (z / w)) - v
  const BinaryExpr *sub = binary(body[0].value.get(), BinaryOp::Sub);
  ASSERT_TRUE(sub);
  const BinaryExpr *add = binary(sub->lhs.get(), BinaryOp::Add);
  ASSERT_TRUE(add);
  const BinaryExpr *mul = binary(add->lhs.get(), BinaryOp::Mul);
  ASSERT_TRUE(mul);
  EXPECT_TRUE(isa<UnaryExpr>(mul->lhs.get()));
  // ((not (p < q)) and r) or s
  const BinaryExpr *orE = binary(body[1].value.get(), BinaryOp::Or);
  ASSERT_TRUE(orE);
  const BinaryExpr *andE = binary(orE->lhs.get(), BinaryOp::And);
  ASSERT_TRUE(andE);
  auto *notE = dyn_cast<UnaryExpr>(andE->lhs.get());
  ASSERT_TRUE(notE);
  EXPECT_EQ(notE->op, UnaryOp::Not);
  EXPECT_TRUE(isa<BinaryExpr>(notE->operand.get()));
}

TEST(Parser, CallArgumentForms) {
  Parsed p("flow f { index { let a = g(x, m -> n, scale = 2, [1, 2.5e-1], "
           "\"s\\\"q\"); } }");
  ASSERT_TRUE(p.module) << p.diags.renderText();
  auto *call = dyn_cast<CallExpr>(p.firstBody()[0].value.get());
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
  Parsed p("// a\nflow /* b */ f { /* c\n d */ index { return x; } } // e");
  EXPECT_TRUE(p.module) << p.diags.renderText();
}

struct SyntaxCase {
  const char *text;
  const char *message;
  unsigned line, column;
};

class SyntaxErrors : public ::testing::TestWithParam<SyntaxCase> {};

TEST_P(SyntaxErrors, ReportMessageAndLocation) {
  const SyntaxCase &c = GetParam();
  Parsed p(c.text);
  EXPECT_FALSE(p.module);
  ASSERT_TRUE(p.diags.hasErrors());
  const Diagnostic &d = p.diags.getDiagnostics().front();
  EXPECT_EQ(d.message, c.message) << p.diags.renderText();
  LineCol lc = p.buf.getLineCol(d.range.begin);
  EXPECT_EQ(lc.line, c.line) << p.diags.renderText();
  EXPECT_EQ(lc.column, c.column) << p.diags.renderText();
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
  Parsed nul(std::string("flow f {\0}", 10));
  EXPECT_FALSE(nul.module);
  EXPECT_TRUE(nul.mentions("NUL byte")) << nul.diags.renderText();
  Parsed badUTF8("flow f { // \xff\xfe\n }");
  EXPECT_FALSE(badUTF8.module);
  EXPECT_TRUE(badUTF8.mentions("not valid UTF-8"))
      << badUTF8.diags.renderText();
}

TEST(Parser, NonASCIICommentsKeepByteColumns) {
  Parsed p("// é ü\nflow f { param a = 1 $; }");
  EXPECT_FALSE(p.module);
  const Diagnostic &d = p.diags.getDiagnostics().front();
  EXPECT_EQ(p.buf.getRangeText(d.range), "$");
}

TEST(Parser, DeepNestingIsRejectedQuickly) {
  Parsed p("flow f { param a = " + std::string(100000, '(') + "1" +
           std::string(100000, ')') + "; }");
  EXPECT_FALSE(p.module);
  EXPECT_TRUE(p.mentions("nesting is too deep")) << p.diags.renderText();
}

TEST(Parser, LongStatementsAreRejected) {
  std::string expr = "1";
  for (int i = 0; i < 5000; ++i)
    expr += " + 1";
  Parsed p("flow f { param a = " + expr + "; }");
  EXPECT_FALSE(p.module);
  EXPECT_TRUE(p.mentions("statement is too long")) << p.diags.renderText();
}

TEST(Parser, JunkStopsAtTheErrorLimit) {
  std::string junk;
  for (int i = 0; i < 20000; ++i)
    junk += "} ) ; flow = [ ";
  Parsed p(junk);
  EXPECT_FALSE(p.module);
  EXPECT_LE(p.diags.getDiagnostics().size(), 20u);
}

TEST(Parser, IntegerLiteralsAreIntsUpTo2To53) {
  Parsed ok("flow f { index { let a = 9007199254740992; let b = 1e19; } }");
  ASSERT_TRUE(ok.module) << ok.diags.renderText();
  const auto &body = ok.firstBody();
  auto *a = dyn_cast<NumberExpr>(body[0].value.get());
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->isInteger);
  EXPECT_EQ(a->value, 9007199254740992.0);
  auto *b = dyn_cast<NumberExpr>(body[1].value.get());
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->isInteger);

  Parsed bad("flow f { index { let a = 9007199254740993; } }");
  EXPECT_FALSE(bad.module);
  ASSERT_EQ(bad.diags.getNumErrors(), 1u);
  const Diagnostic &d = bad.diags.getDiagnostics()[0];
  EXPECT_EQ(bad.buf.getRangeText(d.range), "9007199254740993");
  EXPECT_EQ(d.message.rfind("integer 9007199254740993 is out of range: an "
                            "int must be between -2^53 and 2^53",
                            0),
            0u)
      << d.message;
}

TEST(Parser, NamesAreAtMost64Characters) {
  std::string name64(64, 'n'), name65(65, 'n');
  Parsed ok("flow f { index { let " + name64 + " = 1; } }");
  EXPECT_TRUE(ok.module) << ok.diags.renderText();
  Parsed bad("flow f { index { let " + name65 + " = 1; } }");
  EXPECT_FALSE(bad.module);
  ASSERT_EQ(bad.diags.getNumErrors(), 1u);
  EXPECT_EQ(bad.diags.getDiagnostics()[0].message,
            "name is too long (65 characters; the limit is 64)");
}
