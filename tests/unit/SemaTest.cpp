//===- SemaTest.cpp - Names, shapes, stages, params and budgets -----------===//

#include "../common/StockPrograms.h"
#include "TestUtil.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>

using namespace vflow;
using namespace vflow::ast;
using vflow::test::Checked;

namespace {

std::string example(const std::string &name) {
  return test::readFile(std::string(VFLOW_EXAMPLES_DIR) + "/" + name +
                        ".vflow");
}

/// The info of the value of the first `let NAME` in the index block.
const ExprInfo *letInfo(const Checked &c, const std::string &name) {
  for (const Decl &d : c.module->flows[0].decls)
    if (d.kind == DeclKind::Index)
      for (const Stmt &s : d.body)
        if (s.kind == StmtKind::Let && s.name.name == name)
          return &s.value->info;
  return nullptr;
}

} // namespace

TEST(Sema, EveryExampleChecks) {
  for (const char *name : vflow::testing::kStockPrograms) {
    Checked c(example(name), {}, VFLOW_EXAMPLES_DIR);
    EXPECT_TRUE(c.ok) << name << ":\n" << c.errors();
    for (const Diagnostic &d : c.diags.getDiagnostics())
      EXPECT_NE(d.severity, Severity::Warning) << name << ": " << d.message;
  }
}

TEST(Sema, QuestShapes) {
  Checked c(example("quest"));
  ASSERT_TRUE(c.ok) << c.errors();
  const FlowInfo &f = c.flow();
  ASSERT_EQ(f.fields.size(), 2u);
  EXPECT_EQ(f.fields[0].shape.str(), "[dim:D]");
  EXPECT_EQ(f.fields[0].dtype, DType::BF16);
  const ExprInfo *s = letInfo(c, "s");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shape.str(), "[block:N, head:G]");
  const ParamInfo *budget = f.findParam("budget");
  ASSERT_TRUE(budget);
  EXPECT_EQ(budget->value, 64);
  EXPECT_FALSE(budget->compileTime);
  EXPECT_EQ(f.findParam("block_size")->value, 16);
  EXPECT_TRUE(f.findParam("block_size")->compileTime);
}

TEST(Sema, EPSShapesAndCompileTimeParams) {
  Checked c(example("eps"));
  ASSERT_TRUE(c.ok) << c.errors();
  const FlowInfo &f = c.flow();
  EXPECT_EQ(f.findAxis("m")->size, 8);
  EXPECT_EQ(f.findAxis("n")->size, 8);
  EXPECT_EQ(f.findAxis("token")->size, 128);
  EXPECT_EQ(f.findField("G")->shape.str(), "[m:8, n:8]");
  EXPECT_EQ(f.findField("G")->dtype, DType::F32);
  EXPECT_TRUE(f.findField("frob")->shape.isScalar());
  EXPECT_EQ(f.findConst("Phi")->shape.str(), "[dim:D, m:8]");
  EXPECT_TRUE(f.findParam("sketch")->compileTime);
  EXPECT_FALSE(f.findParam("alpha")->compileTime);
  EXPECT_FALSE(f.findParam("budget")->compileTime);
  EXPECT_EQ(letInfo(c, "z")->shape.str(), "[head:G, m:8]");
  EXPECT_EQ(letInfo(c, "e")->shape.str(), "[block:N, head:G]");
  EXPECT_EQ(letInfo(c, "bound")->shape.str(), "[block:N]");
}

TEST(Sema, SplitMakesSubBlocks) {
  Checked c(example("lserve"));
  ASSERT_TRUE(c.ok) << c.errors();
  EXPECT_EQ(c.flow().findField("kmax")->shape.str(), "[dim:D, sub:4]");
  EXPECT_EQ(letInfo(c, "s")->shape.str(), "[block:N, head:G, sub:4]");
}

TEST(Sema, LoadedConstFixesTheHeadDim) {
  Checked c(example("double_sparse"), {}, VFLOW_EXAMPLES_DIR);
  ASSERT_TRUE(c.ok) << c.errors();
  const FlowInfo &f = c.flow();
  EXPECT_EQ(f.findConst("S")->shape.str(), "[dim:128, c:16]");
  const LiteralData *data = nullptr;
  for (auto &entry : f.literals)
    data = &entry.second;
  ASSERT_TRUE(data);
  ASSERT_EQ(data->values.size(), 128u * 16u);
  // Channel 8 is picked as the second selected channel.
  EXPECT_EQ(data->values[8 * 16 + 1], 1.0f);
  EXPECT_EQ(data->values[8 * 16 + 2], 0.0f);
}

TEST(Sema, ParamOverrides) {
  Checked ok(example("quest"), {{"budget", "32"}, {"quest.block_size", "32"}});
  ASSERT_TRUE(ok.ok) << ok.errors();
  EXPECT_EQ(ok.flow().findParam("budget")->value, 32);
  EXPECT_TRUE(ok.flow().findParam("budget")->overridden);
  EXPECT_EQ(ok.flow().findAxis("token")->size, 32);

  Checked notInt(example("quest"), {{"budget", "3.5"}});
  EXPECT_FALSE(notInt.ok);
  EXPECT_EQ(notInt.firstError(), "-p budget=3.5: '3.5' is not a valid int for "
                                 "param 'budget' of flow 'quest'");

  Checked unknown(example("quest"), {{"budgte", "3"}});
  EXPECT_FALSE(unknown.ok);
  EXPECT_NE(unknown.errors().find("did you mean 'budget'?"), std::string::npos);

  Checked badBlock(example("quest"), {{"block_size", "12"}});
  EXPECT_FALSE(badBlock.ok);
  EXPECT_NE(badBlock.firstError().find("power of two"), std::string::npos);
}

TEST(Sema, BudgetsEvaluateOnTheHost) {
  Checked c("flow f { param budget = 64; cache c = mean(K, token);\n"
            "index { return topk(sum(q * c, head, dim), min(budget, "
            "num_blocks / 2) + 1); } }");
  ASSERT_TRUE(c.ok) << c.errors();
  const Expr *sel = c.flow().selection;
  auto *call = dyn_cast<CallExpr>(sel);
  ASSERT_TRUE(call);
  const Expr &k = *call->args[1].value;
  EXPECT_TRUE(k.info.hostEvaluable);
  EXPECT_EQ(evaluateBudget(k, c.flow(), 1000, 16000, 1).value_or(-1), 65);
  EXPECT_EQ(evaluateBudget(k, c.flow(), 11, 170, 1).value_or(-1), 6);
}

TEST(Sema, BudgetFromDeviceValueIsRejected) {
  Checked c("flow f { cache c = mean(K, token);\n"
            "index { let s = sum(q * c, head, dim);\n"
            "return topk(s, max(s, block)); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.firstError().find("must be computable on the host"),
            std::string::npos);
  EXPECT_NE(c.errors().find("is only known on the device"), std::string::npos);
}

TEST(Sema, StatesSeeTheirStoredValue) {
  Checked c(example("h2o"));
  ASSERT_TRUE(c.ok) << c.errors();
  const StateInfo *acc = c.flow().findState("acc");
  ASSERT_TRUE(acc);
  EXPECT_TRUE(acc->perBlock());
  EXPECT_TRUE(acc->stored);
  EXPECT_EQ(c.flow().findParam("keep_last")->value, 8);
}

TEST(Sema, SeveralErrorsInOneRun) {
  Checked c("flow f {\n cache a = max(K, tokn);\n cache b = mean(q, head);\n"
            " index { return topk(zz, 4); }\n}");
  EXPECT_FALSE(c.ok);
  EXPECT_GE(c.diags.getNumErrors(), 3u) << c.errors();
}

TEST(Sema, CanonicalAxisOrder) {
  Checked c("flow f { axis m = 4; const P = gaussian([m, dim]);\n"
            "cache c = sum(K * P, token);\n"
            "index { let x = c * q; return topk(sum(x, m, dim, head), 8); } }");
  ASSERT_TRUE(c.ok) << c.errors();
  EXPECT_EQ(c.flow().findConst("P")->shape.str(), "[dim:D, m:4]");
  EXPECT_EQ(letInfo(c, "x")->shape.str(), "[block:N, head:G, dim:D, m:4]");
}

TEST(Sema, TensorLiteralIsReorderedToCanonicalOrder) {
  Checked c("flow f { param head_dim = 2; axis m = 3;\n"
            "const W = tensor([m, dim], [[1, 2], [3, 4], [5, 6]]);\n"
            "cache c = sum(sum(K * W, dim), token);\n"
            "index { return topk(sum(c, m), 1); } }");
  ASSERT_TRUE(c.ok) << c.errors();
  const LiteralData &data = c.flow().literals.begin()->second;
  // Canonical order is [dim, m]: W[dim=0] = 1 3 5, W[dim=1] = 2 4 6.
  std::vector<float> want = {1, 3, 5, 2, 4, 6};
  EXPECT_EQ(data.values, want);
}

TEST(Sema, StatesMayUseAxesMadeInTheCacheStage) {
  Checked c("flow s1 { param block_size = 8;\n"
            "cache kmax = max(split(K, token, sub = 2), token);\n"
            "state acc[block, sub] = 0;\n"
            "index { acc = acc * 0.5 + sum(q * kmax, dim, head);\n"
            "return topk(max(acc, sub), 4); } }");
  EXPECT_TRUE(c.ok) << c.errors();
  EXPECT_EQ(c.flow().findState("acc")->shape.str(), "[block:N, sub:2]");
}

TEST(Sema, ParamsReadByOtherParamsOrStateInitsAreCompileTime) {
  Checked c("flow f { param budget = 4; param twice = budget * 2;\n"
            "param init0 = 0.5; state acc[block] = init0;\n"
            "index { acc = acc + position; return topk(acc, twice); } }",
            {{"budget", "8"}});
  ASSERT_TRUE(c.ok) << c.errors();
  // The override applies before `twice` is computed.
  EXPECT_EQ(c.flow().findParam("twice")->value, 16);
  EXPECT_TRUE(c.flow().findParam("budget")->compileTime);
  EXPECT_TRUE(c.flow().findParam("init0")->compileTime);
  EXPECT_FALSE(c.flow().findParam("twice")->compileTime);
  EXPECT_EQ(c.flow().findState("acc")->init, 0.5);
}

TEST(Sema, AnAxisNameHasOneSize) {
  Checked c("flow f { param block_size = 16;\n"
            "cache a = max(split(K, token, sub = 2), token);\n"
            "cache b = max(split(K, token, sub = 4), token);\n"
            "index { return topk(sum(q * a, head, dim, sub) + sum(q * b, "
            "head, dim, sub), 4); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.firstError().find("axis 'sub' is made elsewhere with size 2, "
                                "but this makes it 4"),
            std::string::npos)
      << c.errors();
}

TEST(Sema, AStateInErrorCausesNoFollowOnErrors) {
  Checked c("flow f { state acc[block, nosuch] = 0;\n"
            "index { acc = acc * 0.5 + position; return topk(acc, 4); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.diags.getNumErrors(), 1u) << c.errors();
}

//===----------------------------------------------------------------------===//
// The size model (issue 9)
//===----------------------------------------------------------------------===//

namespace {

/// The text of the range of the first error.
std::string firstErrorText(const Checked &c) {
  for (const Diagnostic &d : c.diags.getDiagnostics())
    if (d.severity == Severity::Error)
      return c.buffer.getRangeText(d.range);
  return "";
}

} // namespace

TEST(SizeModel, ElementCountsDoNotOverflow) {
  // 2^64 elements: the product overflows int64 to 0 without the model.
  Checked c("flow f { axis a = 65536; axis b = 65536; axis c = 65536;\n"
            "axis d = 65536;\n"
            "const C = gaussian([a, b, c, d], seed = 0);\n"
            "index { return topk(position + sum(C, a, b, c, d), 4); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.diags.getNumErrors(), 1u) << c.errors();
  EXPECT_EQ(c.firstError(),
            "this value is too large: [a:65536, b:65536, c:65536, d:65536] is "
            "about 1.84e+19 elements; the limit is 2147483647 (2^31 - 1)");
  EXPECT_EQ(firstErrorText(c), "gaussian([a, b, c, d], seed = 0)");
}

TEST(SizeModel, SymbolicAxesCountAtTheirLargest) {
  Checked c("flow f { axis m = 65536;\n"
            "state big[block, head, dim, m] = 0;\n"
            "index { big = big + position; return topk(max(sum(big, dim, m),"
            " head), 4); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.diags.getNumErrors(), 1u) << c.errors();
  EXPECT_EQ(c.firstError(),
            "state 'big' is too large: [block:N, head:G, dim:D, m:65536] is "
            "4294967296 elements per block with G = 64 and D = 1024 (their "
            "largest values); the limit is 2147483647 (2^31 - 1) per block");
  EXPECT_EQ(firstErrorText(c), "big[block, head, dim, m");
  EXPECT_NE(c.errors().find("set 'param head_dim = ...;'"), std::string::npos);
  // Specialized to D = 128 it fits: 64 x 128 x 65536 = 2^29.
  Checked fixed("flow f { param head_dim = 128; axis m = 65536;\n"
                "state big[block, head, dim, m] = 0;\n"
                "index { big = big + position; return topk(max(sum(big, dim, "
                "m), head), 4); } }");
  EXPECT_TRUE(fixed.ok) << fixed.errors();
}

TEST(SizeModel, IntermediatesAreChecked) {
  // Each operand fits; their product [head, dim, m, n] does not.
  Checked c("flow f { axis m = 16384; axis n = 64;\n"
            "const C = gaussian([m, n], seed = 0);\n"
            "index { let b = q * C;\n"
            "return topk(position + sum(b, head, dim, m, n), 4); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.diags.getNumErrors(), 1u) << c.errors();
  EXPECT_EQ(firstErrorText(c), "q * C");
  EXPECT_NE(c.firstError().find("is 68719476736 elements with G = 64 and D "
                                "= 1024 (their largest values)"),
            std::string::npos)
      << c.firstError();
}

TEST(SizeModel, FixedSizeAxesAreBoundedByWhatTheCompilerMaterializes) {
  // A product of two small consts (the consts' total is 2^20).
  Checked atLimit("flow f { axis m = 65536; axis n = 256;\n"
                  "const A = gaussian([m], seed = 0);\n"
                  "const B = gaussian([n], seed = 1);\n"
                  "index { return topk(position + sum(A * B, m, n), 4); } }");
  EXPECT_TRUE(atLimit.ok) << atLimit.errors();
  Checked over("flow f { axis m = 65536; axis n = 512;\n"
               "const A = gaussian([m], seed = 0);\n"
               "const B = gaussian([n], seed = 1);\n"
               "index { return topk(position + sum(A * B, m, n), 4); } }");
  EXPECT_FALSE(over.ok);
  EXPECT_EQ(over.firstError(),
            "this value is too large: [m:65536, n:512] has 33554432 elements "
            "in its fixed-size axes; the limit is 16777216 (2^24)");
  // Literal data is refused before its entries are looked at.
  Checked literal("flow f { axis m = 65536; axis n = 512;\n"
                  "const C = tensor([m, n], [[1]]);\n"
                  "index { return topk(position + sum(C, m, n), 4); } }");
  EXPECT_FALSE(literal.ok);
  EXPECT_EQ(literal.diags.getNumErrors(), 1u) << literal.errors();
  EXPECT_NE(literal.firstError().find("fixed-size axes"), std::string::npos);
}

TEST(SizeModel, AValueHasAtMost16Axes) {
  std::string axes, list;
  for (int i = 0; i < 17; ++i) {
    axes += "axis a" + std::to_string(i) + " = 1;\n";
    list += (i ? ", a" : "a") + std::to_string(i);
  }
  Checked c("flow f {\n" + axes + "const C = gaussian([" + list +
            "], seed = 0);\nindex { return topk(position, 4); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.firstError(),
            "this list has 17 axes; a value may have at most 16");
}

//===----------------------------------------------------------------------===//
// Int range (issue 9)
//===----------------------------------------------------------------------===//

TEST(IntRange, LiteralsBeyond2To53AreErrorsNotFloats) {
  Checked max("flow f { param budget = 9007199254740992;\n"
              "index { return topk(position, budget); } }");
  ASSERT_TRUE(max.ok) << max.errors();
  EXPECT_EQ(max.flow().findParam("budget")->type, ParamType::Int);
  EXPECT_EQ(max.flow().findParam("budget")->value, 9007199254740992.0);
  for (const char *big : {"9007199254740993", "9223372036854775807",
                          "99999999999999999999999999999999999999"}) {
    Checked c(std::string("flow f { param budget = ") + big +
              ";\nindex { return topk(position, budget); } }");
    EXPECT_FALSE(c.ok) << big;
    EXPECT_NE(c.firstError().find("is out of range: an int must be between "
                                  "-2^53 and 2^53 (9007199254740992)"),
              std::string::npos)
        << c.firstError();
    EXPECT_EQ(firstErrorText(c), big);
  }
  // A float literal of that size is a float.
  Checked asFloat("flow f { param alpha = 9223372036854775807.0;\n"
                  "index { return topk(position * alpha, 4); } }");
  EXPECT_TRUE(asFloat.ok) << asFloat.errors();
  EXPECT_EQ(asFloat.flow().findParam("alpha")->type, ParamType::Float);
}

TEST(IntRange, ComputedIntParamsAreChecked) {
  Checked c("flow f { param big = 9007199254740992 * 4;\n"
            "index { return topk(position, 4); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.firstError().find("the value of int param 'big' is "
                                "36028797018963968, out of range"),
            std::string::npos)
      << c.firstError();
  Checked declared("flow f { param big: int = 1e17;\n"
                   "index { return topk(position, 4); } }");
  EXPECT_FALSE(declared.ok);
  EXPECT_NE(declared.firstError().find("out of range"), std::string::npos);
}

TEST(IntRange, OverridesFollowTheSameRule) {
  const char *flow = "flow f { param budget = 4;\n"
                     "index { return topk(position, budget); } }";
  Checked max(flow, {{"budget", "9007199254740992"}});
  EXPECT_TRUE(max.ok) << max.errors();
  EXPECT_EQ(max.flow().findParam("budget")->value, 9007199254740992.0);
  // 2^53 + 1 rounds to 2^53 in a double: it must be refused, not rounded.
  for (const char *big : {"9007199254740993", "9223372036854775807",
                          "-9007199254740993", "1e300"}) {
    Checked c(flow, {{"budget", big}});
    EXPECT_FALSE(c.ok) << big;
    EXPECT_EQ(c.firstError(),
              std::string("-p budget=") + big + ": '" + big +
                  "' is out of range for int param 'budget' of flow 'f': an "
                  "int must be between -2^53 and 2^53 (9007199254740992)");
  }
  Checked notInt(flow, {{"budget", "12abc"}});
  EXPECT_EQ(notInt.firstError(), "-p budget=12abc: '12abc' is not a valid int "
                                 "for param 'budget' of flow 'f'");
}

//===----------------------------------------------------------------------===//
// -p names (issue 9)
//===----------------------------------------------------------------------===//

TEST(ParamOverrideNames, MalformedNamesSayWhatIsWrong) {
  ParamOverride ov;
  std::string why;
  ASSERT_TRUE(parseParamOverride("quest.budget=32", ov, why)) << why;
  EXPECT_EQ(ov.name, "quest.budget");
  EXPECT_EQ(ov.value, "32");
  ASSERT_TRUE(parseParamOverride("budget=", ov, why)) << why;
  EXPECT_EQ(ov.value, "");
  struct Case {
    const char *text, *why;
  } cases[] = {
      {"budget", "expected NAME=VALUE or FLOW.NAME=VALUE"},
      {"=3", "the param name before '=' is missing"},
      {".budget=3", "the flow name before '.' is missing"},
      {"quest.=3", "the param name after '.' is missing"},
      {"a.b.c=3", "'a.b.c' has more than one '.'"},
      {"bud get=3", "'bud get' is not a valid param name"},
      {"1x=3", "'1x' is not a valid param name"},
      {"9q.budget=3", "'9q' is not a valid flow name"},
  };
  for (const Case &c : cases) {
    EXPECT_FALSE(parseParamOverride(c.text, ov, why)) << c.text;
    EXPECT_EQ(why.rfind(c.why, 0), 0u) << c.text << ": " << why;
  }
  // A caller that skipped the check gets the same reason from the checker.
  Checked c("flow f { param budget = 4;\n"
            "index { return topk(position, budget); } }",
            {{".budget", "3"}});
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.diags.getNumErrors(), 1u) << c.errors();
  EXPECT_EQ(c.firstError().rfind(
                "-p .budget=3: the flow name before '.' is missing", 0),
            0u)
      << c.firstError();
}

//===----------------------------------------------------------------------===//
// Budgets must be numbers >= 0 (issue 9)
//===----------------------------------------------------------------------===//

TEST(BudgetValues, NegativeAtASampleIsAnError) {
  Checked c("flow f {\nindex { return topk(position, num_blocks / 8 - 4); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.firstError(), "budget 'num_blocks / 8 - 4' is -4 at num_blocks "
                            "= 0; a budget must be >= 0: write max(0, ...)");
  EXPECT_EQ(firstErrorText(c), "num_blocks / 8 - 4");
  Checked fixed("flow f {\nindex { return topk(position, max(0, num_blocks / "
                "8 - 4)); } }");
  EXPECT_TRUE(fixed.ok) << fixed.errors();
}

TEST(BudgetValues, NaNIsAnError) {
  Checked c("flow f { param budget = 0;\n"
            "index { return topk(position, budget / budget); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.firstError(), "budget 'budget / budget' is NaN (not a number) "
                            "with budget = 0; a budget must be a number >= 0");
}

TEST(BudgetValues, OverridesAreApplied) {
  const char *flow = "flow f { param budget = 4;\n"
                     "index { return topk(position, budget); } }";
  Checked c(flow, {{"budget", "-3"}});
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.firstError(), "budget 'budget' is -3 with budget = -3 (from -p)"
                            "; a budget must be >= 0: write max(0, ...)");
  Checked zero(flow, {{"budget", "0"}});
  EXPECT_TRUE(zero.ok) << zero.errors();
}

TEST(BudgetValues, ContextLengthsAtBothEndsOfABlock) {
  // 8 - 15 at the last token of the first block.
  Checked c("flow f {\nindex { return topk(position, 8 - (context_len - "
            "num_blocks * 16)); } }");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.firstError().rfind("budget '8 - (context_len - num_blocks * "
                                 "16)' is -7 at num_blocks = 0, context_len = "
                                 "15;",
                                 0),
            0u)
      << c.firstError();
  // Negative only for long sequences.
  Checked late("flow f {\nindex { return topk(position, 1000 - num_blocks); "
               "} }");
  EXPECT_FALSE(late.ok);
  EXPECT_NE(late.firstError().find("is -24 at num_blocks = 1024"),
            std::string::npos)
      << late.firstError();
}

TEST(BudgetValues, EveryKindOfBudgetAndLetsAreChecked) {
  Checked let("flow f {\nindex { let k = num_blocks - 1;\n"
              "return topk(position, k); } }");
  EXPECT_FALSE(let.ok);
  EXPECT_EQ(let.firstError().rfind("budget 'k' is -1 at num_blocks = 0", 0), 0u)
      << let.firstError();
  Checked maxArg("flow f {\nindex { return threshold(position, 1, max = -1); "
                 "} }");
  EXPECT_FALSE(maxArg.ok);
  EXPECT_EQ(firstErrorText(maxArg), "-1");
  Checked kth("flow f {\nindex { return threshold(position, "
              "kth_largest(position, 0 - 2), max = 4); } }");
  EXPECT_FALSE(kth.ok);
  EXPECT_EQ(firstErrorText(kth), "0 - 2");
  Checked approx("flow f {\nindex { return approx_topk(position, -0.5); } "
                 "}");
  EXPECT_FALSE(approx.ok);
  EXPECT_NE(approx.firstError().find("is -0.5;"), std::string::npos)
      << approx.firstError();
}

TEST(BudgetValues, TheHostEvaluatesBudgetsThroughLets) {
  Checked c("flow f { param budget = 8;\n"
            "index { let half = num_blocks / 2; let k = min(budget, half);\n"
            "return topk(position, k); } }");
  ASSERT_TRUE(c.ok) << c.errors();
  const Expr &k = *cast<CallExpr>(*c.flow().selection).args[1].value;
  EXPECT_EQ(evaluateBudget(k, c.flow(), 100, 1600, 1).value_or(-1), 8);
  EXPECT_EQ(evaluateBudget(k, c.flow(), 5, 80, 1).value_or(-1), 2);
  EXPECT_EQ(evaluateBudgetValue(k, c.flow(), 5, 80, 1).value_or(-1), 2.5);
  EXPECT_EQ(roundBudget(-1), 0);
  EXPECT_EQ(roundBudget(NAN), 0);
  EXPECT_EQ(roundBudget(2.9), 2);
}

//===----------------------------------------------------------------------===//
// Large inputs check in linear time (issue 9)
//===----------------------------------------------------------------------===//

namespace {

/// Checks `text` (which must be accepted) and returns the seconds it took.
double secondsToCheck(const std::string &text) {
  auto start = std::chrono::steady_clock::now();
  Checked c(text);
  double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_TRUE(c.ok) << c.errors().substr(0, 2000);
  return took;
}

/// About 1 MiB of `item(i)` between `head` and `tail`.
std::string fill(const std::string &head,
                 const std::function<std::string(int)> &item,
                 const std::string &tail) {
  std::string out = head;
  for (int i = 0; out.size() + tail.size() < 1000000; ++i)
    out += item(i);
  return out + tail;
}

} // namespace

// Each input is about 1 MiB. Every one took from 3 s to over a minute before
// (linear name lookups, const values walked again from every const that
// reads them, axis order rebuilt per shape); now each checks in about half
// a second. The bound is generous for a loaded CI machine.
TEST(LargeInputs, CheckInLinearTime) {
  constexpr double kBound = 5.0;
  // `decl` x(i+1) = x(i) + x(i); for names x of `name`: a chain that
  // doubles.
  auto doubling = [](std::string decl, std::string name) {
    return [=](int i) {
      const std::string from = name + std::to_string(i);
      return decl + name + std::to_string(i + 1) + " = " + from + " + " + from +
             ";\n";
    };
  };
  const struct {
    const char *what, *head;
    std::function<std::string(int)> item;
    const char *tail;
  } inputs[] = {
      {"20,000 flows", "",
       [](int i) {
         return "flow f" + std::to_string(i) +
                " { index { return topk(position, 4); } }\n";
       },
       ""},
      {"a chain of consts",
       "flow f {\n const c0 = gaussian([token], seed = 1);\n",
       doubling(" const ", "c"), " index { return topk(position, 4); }\n}\n"},
      {"a chain of params", "flow f {\n param p0 = 1;\n",
       [](int i) {
         return " param p" + std::to_string(i + 1) + " = p" +
                std::to_string(i) + " + 1;\n";
       },
       " index { return topk(position, p0); }\n}\n"},
      {"many axes", "flow f {\n",
       [](int i) { return " axis a" + std::to_string(i) + " = 2;\n"; },
       " index { return topk(position, 4); }\n}\n"},
      {"many splits", "flow f {\n param head_dim = 128;\n",
       [](int i) {
         std::string n = std::to_string(i);
         return " const c" + n +
                " = sum(split(gaussian([dim], seed = 0), dim, n" + n +
                " = 2), n" + n + ");\n";
       },
       " index { return topk(position, 4); }\n}\n"},
      {"a budget read through a chain of lets",
       "flow f {\n index {\n  let x0 = num_blocks;\n", doubling("  let ", "x"),
       "  return topk(position, min(4, x1000));\n }\n}\n"},
  };
  for (const auto &in : inputs)
    EXPECT_LT(secondsToCheck(fill(in.head, in.item, in.tail)), kBound)
        << in.what;
}
