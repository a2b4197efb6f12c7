//===- DifferentialTest.cpp - Passes do not change what flows compute -----===//
//
// For every stock program, the pipeline is applied one pass at a time; after
// each pass the reference interpreter must compute exactly what it computed
// on the lowered IR (same fields, selections and states) on fresh random
// workloads.
//
//===----------------------------------------------------------------------===//

#include "../common/StockPrograms.h"
#include "ProgramGenerator.h"
#include "Trace.h"

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Passes.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

#include <gtest/gtest.h>

using namespace vflow;

namespace {

struct Stage {
  std::string name;
  std::function<void(mlir::OpPassManager &)> add;
};

std::vector<Stage> pipelineStages() {
  return {
      {"canonicalize",
       [](mlir::OpPassManager &pm) {
         pm.addPass(mlir::createCanonicalizerPass());
       }},
      {"cse",
       [](mlir::OpPassManager &pm) { pm.addPass(mlir::createCSEPass()); }},
      {"vt-hoist-consts",
       [](mlir::OpPassManager &pm) {
         pm.nest<vt::FlowOp>().addPass(createHoistConsts());
       }},
      {"vt-fuse-kernels",
       [](mlir::OpPassManager &pm) {
         pm.nest<vt::FlowOp>().addPass(createFuseKernels());
       }},
      {"vt-plan-launches",
       [](mlir::OpPassManager &pm) {
         pm.nest<vt::FlowOp>().addPass(createPlanLaunches());
       }},
  };
}

/// Checks every pass of the pipeline on one program's source; returns the
/// first failure (empty on success).
std::string checkProgram(const std::string &name, const std::string &source,
                         const std::string &baseDir, int64_t headDim,
                         int64_t group, unsigned seeds) {
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  Compilation c(std::make_unique<SourceBuffer>(name, source));
  SemaOptions options;
  options.baseDir = baseDir;
  if (!compileSource(c, context, options, CompileStage::VT))
    return "does not compile: " + c.diags.renderText();
  auto flowOf = [](mlir::ModuleOp m) {
    return *m.getBody()->getOps<vt::FlowOp>().begin();
  };
  std::vector<trace::Trace> before;
  for (unsigned s = 0; s < seeds; ++s)
    before.push_back(trace::runTrace(flowOf(*c.vt), headDim, group, s + 1));
  for (const Stage &stage : pipelineStages()) {
    mlir::PassManager pm(&context);
    stage.add(pm);
    if (mlir::failed(pm.run(*c.vt)))
      return "pass " + stage.name + " failed";
    if (mlir::failed(mlir::verify(*c.vt)))
      return "IR after " + stage.name + " does not verify";
    for (unsigned s = 0; s < seeds; ++s) {
      trace::Trace after =
          trace::runTrace(flowOf(*c.vt), headDim, group, s + 1);
      std::string diff = trace::compareTraces(before[s], after);
      if (!diff.empty())
        return "after " + stage.name + " (seed " + std::to_string(s + 1) +
               "): " + diff;
    }
  }
  return "";
}

class StockProgram : public ::testing::TestWithParam<const char *> {};

} // namespace

TEST_P(StockProgram, EveryPassKeepsTheInterpreterResults) {
  std::string name = GetParam();
  std::string path = std::string(VFLOW_EXAMPLES_DIR) + "/" + name + ".vflow";
  std::string text, error;
  ASSERT_TRUE(readSourceFile(path, text, error)) << error;
  int64_t headDim = name == "double_sparse" ? 128 : 32;
  std::string diff =
      checkProgram(path, text, VFLOW_EXAMPLES_DIR, headDim, 4, 3);
  EXPECT_EQ(diff, "");
}

INSTANTIATE_TEST_SUITE_P(Examples, StockProgram,
                         ::testing::ValuesIn(vflow::testing::kStockPrograms));

TEST(Differential, EveryBuiltinProgram) {
  std::string path =
      std::string(VFLOW_LIT_DIR) + "/frontend/every-builtin.vflow";
  std::string text, error;
  ASSERT_TRUE(readSourceFile(path, text, error)) << error;
  EXPECT_EQ(checkProgram(path, text, ".", 4, 3, 3), "");
}

TEST(Differential, RandomWellTypedPrograms) {
  // Random programs from the generator, through every pass. Set
  // VFLOW_DIFFERENTIAL_SEEDS=N (and VFLOW_DIFFERENTIAL_FIRST=S) for a
  // longer search.
  std::string dir = ::testing::TempDir();
  auto seeds = vflow::testing::seedRangeFromEnv("VFLOW_DIFFERENTIAL", 150);
  for (uint64_t seed = seeds.first; seed < seeds.first + seeds.count; ++seed) {
    vflow::testing::GeneratorOptions options;
    options.seed = seed;
    vflow::testing::GeneratedProgram program =
        vflow::testing::generateProgram(options);
    vflow::testing::writeProgramFiles(program, dir);
    std::string diff =
        checkProgram("random-" + std::to_string(seed) + ".vflow",
                     program.source, dir, program.headDim, program.group, 2);
    EXPECT_EQ(diff, "") << "seed " << seed << ":\n" << program.source;
  }
}

TEST(Differential, DetectsAChangedResult) {
  // The comparison itself must be able to fail.
  trace::Trace a, b;
  a.selections = {{1, 2}};
  b.selections = {{1, 3}};
  EXPECT_NE(trace::compareTraces(a, b), "");
  interp::Tensor x({"block"}, {2}), y({"block"}, {2});
  x.data = {1.0f, 2.0f};
  y.data = {1.0f, 2.001f};
  a = b;
  a.states = {{{"acc", x}}};
  b.states = {{{"acc", y}}};
  EXPECT_NE(trace::compareTraces(a, b), "");
}
