//===- vflow-opt.cpp - vt dialect optimizer driver ------------------------===//
//
// mlir-opt with the vt dialect, the upstream canonicalize and CSE passes and
// every vflow pass (--vt-fuse-kernels, --vt-plan-launches, ...), so each pass
// can be run alone on a file.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"
#include "vflow/Dialect/VT/VTOps.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  vflow::registerCompilerPasses();
  mlir::PassPipelineRegistration<>(
      "vflow-pipeline",
      "The whole vflow pipeline (what vflowc --emit=kernels runs)",
      [](mlir::OpPassManager &pm) { vflow::buildCompilerPipeline(pm); });

  mlir::DialectRegistry registry;
  registry.insert<vflow::vt::VTDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "vflow optimizer driver\n", registry));
}
