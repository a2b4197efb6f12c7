//===- vflow-opt.cpp - vt dialect optimizer driver ------------------------===//
//
// mlir-opt with the vt dialect and the upstream canonicalize and CSE passes.
//
//===----------------------------------------------------------------------===//

#include "vflow/Dialect/VT/VTOps.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();

  mlir::DialectRegistry registry;
  registry.insert<vflow::vt::VTDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "vflow optimizer driver\n", registry));
}
