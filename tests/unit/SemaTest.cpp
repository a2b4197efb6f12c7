//===- SemaTest.cpp - Names, shapes, stages, params and budgets -----------===//

#include "TestUtil.h"

#include <gtest/gtest.h>

using namespace vflow;
using namespace vflow::ast;
using vflow::test::Checked;

namespace {

const char *const kExamples[] = {"block_topk",   "quest",      "h2o",
                                 "eps",          "lserve",     "running_avg",
                                 "value_gate",   "above_mean", "sliding_window",
                                 "double_sparse"};

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
  for (const char *name : kExamples) {
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
  EXPECT_EQ(evaluateBudget(k, c.flow(), 1000, 16000).value_or(-1), 65);
  EXPECT_EQ(evaluateBudget(k, c.flow(), 11, 170).value_or(-1), 6);
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
