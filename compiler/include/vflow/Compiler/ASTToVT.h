//===- ASTToVT.h - Lowering checked flows to the vt dialect -----*- C++ -*-===//

#ifndef VFLOW_COMPILER_ASTTOVT_H
#define VFLOW_COMPILER_ASTTOVT_H

#include "vflow/Frontend/Sema.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace vflow {

/// Lowers every checked flow of `module` into one `vt.flow` op. The AST must
/// have passed semantic analysis. Each op carries the source location of the
/// expression it comes from.
mlir::OwningOpRef<mlir::ModuleOp> lowerToVT(mlir::MLIRContext &context,
                                            const ast::Module &module,
                                            const CheckedModule &checked,
                                            const SourceBuffer &buffer);

/// Registers the dialects the compiler uses.
void registerCompilerDialects(mlir::MLIRContext &context);

} // namespace vflow

#endif // VFLOW_COMPILER_ASTTOVT_H
