//===- Passes.h - vflow compiler passes -------------------------*- C++ -*-===//

#ifndef VFLOW_COMPILER_PASSES_H
#define VFLOW_COMPILER_PASSES_H

#include "vflow/Dialect/VT/VTOps.h"

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include <memory>
#include <string>

namespace vflow {

#define GEN_PASS_DECL
#include "vflow/Compiler/Passes.h.inc"

/// registerCompilerPasses(): registers every vflow pass (for vflow-opt).
#define GEN_PASS_REGISTRATION
#include "vflow/Compiler/Passes.h.inc"

/// The pipeline from lowered vt IR to planned kernels, in order:
/// canonicalize, CSE, const hoisting, fusion, launch planning.
void buildCompilerPipeline(mlir::OpPassManager &pm);

/// The pipeline as text (`vflowc --print-pipeline`).
std::string describeCompilerPipeline();

} // namespace vflow

#endif // VFLOW_COMPILER_PASSES_H
