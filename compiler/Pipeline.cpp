//===- Pipeline.cpp - The vflow pass pipeline -----------------------------===//
//
// The whole pipeline in one function, so it reads (and reorders) in one
// place; `vflowc --print-pipeline` prints it.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"

#include "mlir/Transforms/Passes.h"
#include "llvm/Support/raw_ostream.h"

using namespace vflow;

void vflow::buildCompilerPipeline(mlir::OpPassManager &pm) {
  pm.addPass(mlir::createCanonicalizerPass());
  pm.addPass(mlir::createCSEPass());
  mlir::OpPassManager &flow = pm.nest<vt::FlowOp>();
  flow.addPass(createHoistConsts());
  flow.addPass(createFuseKernels());
  flow.addPass(createPlanLaunches());
}

std::string vflow::describeCompilerPipeline() {
  mlir::OpPassManager pm("builtin.module");
  buildCompilerPipeline(pm);
  std::string text;
  llvm::raw_string_ostream os(text);
  pm.printAsTextualPipeline(os);
  return os.str();
}
