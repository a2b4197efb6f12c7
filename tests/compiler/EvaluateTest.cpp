//===- EvaluateTest.cpp - vflowc run: selection quality on the workload ---===//

#include "vflow/Compiler/Evaluate.h"
#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Artifact.h"
#include "vflow/Compiler/Driver.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace vflow;

namespace {

struct Compiled {
  mlir::MLIRContext context;
  std::unique_ptr<Compilation> c;
  explicit Compiled(const std::string &name,
                    std::vector<ParamOverride> overrides = {}) {
    registerCompilerDialects(context);
    std::string path = std::string(VFLOW_EXAMPLES_DIR) + "/" + name + ".vflow";
    std::string text, error;
    EXPECT_TRUE(readSourceFile(path, text, error)) << error;
    c = std::make_unique<Compilation>(
        std::make_unique<SourceBuffer>(path, text));
    SemaOptions options;
    options.baseDir = VFLOW_EXAMPLES_DIR;
    options.overrides = std::move(overrides);
    EXPECT_TRUE(compileSource(*c, context, options, CompileStage::VT))
        << c->diags.renderText();
  }
  vt::FlowOp flow() { return *c->vt->getBody()->getOps<vt::FlowOp>().begin(); }
  /// Runs the flow on `spec` from its artifact, as vflowc run does.
  eval::FlowReport run(const eval::WorkloadSpec &spec) {
    if (artifact.flows.empty()) {
      std::string error;
      EXPECT_TRUE(buildArtifact(*c, artifact, error)) << error;
    }
    return eval::evaluateFlow(flow(), artifact.flows.at(0), spec);
  }
  rt::Artifact artifact;
};

eval::WorkloadSpec smallWorkload() {
  eval::WorkloadSpec spec;
  spec.lengths = {1541, 3079};
  spec.numKVHeads = 2;
  spec.group = 2;
  spec.headDim = 64;
  spec.steps = 2;
  spec.needles = 3;
  spec.distractors = 0;
  spec.headSpread = 0;
  return spec;
}

} // namespace

TEST(Evaluate, QuestAndBlockTopKFindTheNeedles) {
  for (const char *name : {"quest", "block_topk"}) {
    Compiled prog(name, {{"budget", "16"}});
    eval::FlowReport r = prog.run(smallWorkload());
    EXPECT_GT(r.flowMetrics.recall, r.randomMetrics.recall + 0.3) << name;
    EXPECT_GE(r.flowMetrics.needleHit, 0.9) << name;
    EXPECT_LT(r.flowMetrics.relError, r.randomMetrics.relError) << name;
    // 16 chosen + the first and last kept + the partial last block.
    EXPECT_NEAR(r.blocksAttended, 19.0, 1e-9) << name;
  }
}

TEST(Evaluate, OracleBoundsEveryFlowAndSeedsGiveStandardErrors) {
  for (const char *name : {"quest", "block_topk", "sliding_window"}) {
    Compiled prog(
        name,
        {{std::string(name) == "sliding_window" ? "window" : "budget", "8"}});
    eval::WorkloadSpec spec = smallWorkload();
    eval::FlowReport r = prog.run(spec);
    EXPECT_EQ(r.seeds, 3) << name;
    // The oracle keeps the most mass that as many blocks can keep.
    EXPECT_GE(r.oracleMetrics.recall, r.flowMetrics.recall - 1e-9) << name;
    EXPECT_GE(r.oracleMetrics.recall, r.randomMetrics.recall) << name;
    EXPECT_GT(r.flowSE.recall, 0.0) << name;
    EXPECT_GT(r.randomSE.recall, 0.0) << name;
    // One seed: the same run as seed 1 alone, no standard error.
    spec.seeds = 1;
    eval::FlowReport one = prog.run(spec);
    EXPECT_EQ(one.seeds, 1);
    EXPECT_EQ(one.flowSE.recall, 0.0);
    eval::WorkloadSpec second = spec;
    second.seed = 2;
    eval::FlowReport two = prog.run(second);
    eval::WorkloadSpec third = spec;
    third.seed = 3;
    eval::FlowReport three = prog.run(third);
    EXPECT_NEAR(r.flowMetrics.recall,
                (one.flowMetrics.recall + two.flowMetrics.recall +
                 three.flowMetrics.recall) /
                    3,
                1e-12)
        << name;
  }
}

TEST(Evaluate, DistractorsFoolAPerChannelBoundNotACentroid) {
  // Distractor spans (needle-strength keys with random signs) spread every
  // channel's min and max: Quest's bound over-rates them, block top-k's
  // centroid and the oracle do not.
  eval::WorkloadSpec spec = smallWorkload();
  spec.distractors = 0.3;
  Compiled quest("quest", {{"budget", "8"}});
  Compiled centroid("block_topk", {{"budget", "8"}});
  eval::FlowReport q = quest.run(spec), c = centroid.run(spec);
  EXPECT_LT(q.flowMetrics.needleHit, 0.5);
  EXPECT_GE(c.flowMetrics.needleHit, 0.9);
  EXPECT_GT(c.flowMetrics.recall, q.flowMetrics.recall + 5 * q.flowSE.recall);
  EXPECT_GT(q.oracleMetrics.needleHit, q.flowMetrics.needleHit + 0.3);
}

TEST(Evaluate, QueryHeadsThatDisagreeWidenTheGapToTheOracle) {
  Compiled centroid("block_topk", {{"budget", "8"}});
  eval::WorkloadSpec agree = smallWorkload(), disagree = smallWorkload();
  disagree.headSpread = 1.0;
  eval::FlowReport a = centroid.run(agree), d = centroid.run(disagree);
  EXPECT_LT(d.oracleMetrics.recall, a.oracleMetrics.recall);
  EXPECT_GT(d.oracleMetrics.recall - d.flowMetrics.recall,
            a.oracleMetrics.recall - a.flowMetrics.recall);
}

TEST(Evaluate, PositionOnlySelectionHasNoNeedleSkill) {
  Compiled prog("sliding_window", {{"window", "16"}});
  eval::FlowReport r = prog.run(smallWorkload());
  EXPECT_LT(r.flowMetrics.needleHit, 0.5);
}

TEST(Evaluate, IsDeterministicForASeed) {
  Compiled prog("quest", {{"budget", "8"}});
  eval::FlowReport a = prog.run(smallWorkload());
  eval::FlowReport b = prog.run(smallWorkload());
  EXPECT_EQ(a.flowMetrics.recall, b.flowMetrics.recall);
  EXPECT_EQ(a.randomMetrics.recall, b.randomMetrics.recall);
  eval::WorkloadSpec other = smallWorkload();
  other.seed = 2;
  eval::FlowReport c = prog.run(other);
  EXPECT_NE(a.flowMetrics.recall, c.flowMetrics.recall);
}

TEST(Evaluate, StatefulFlowRuns) {
  Compiled prog("h2o", {{"budget", "8"}});
  eval::FlowReport r = prog.run(smallWorkload());
  EXPECT_GT(r.flowMetrics.recall, r.randomMetrics.recall);
}

TEST(Evaluate, BadWorkloadsAndFlowsAreClearErrors) {
  Compiled prog("quest");
  eval::WorkloadSpec spec = smallWorkload();
  spec.headDim = 7;
  EXPECT_THROW(
      {
        try {
          prog.run(spec);
        } catch (const std::runtime_error &e) {
          EXPECT_NE(std::string(e.what()).find("--head-dim"),
                    std::string::npos);
          throw;
        }
      },
      std::runtime_error);
  Compiled fixed("double_sparse"); // specialized to head_dim 128
  EXPECT_THROW(fixed.run(smallWorkload()), std::runtime_error);
}
